"""Every manifest under deploy/kubernetes/ against its API schema, without a cluster.

Core and RBAC kinds go through the ``kubernetes`` client's models (required fields refused
when missing, unknown fields dropped, so the round trip must equal the file); the custom kinds
(InferencePool, Gateway, HTTPRoute) against their upstream field lists (``manifests.py``).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kubernetes.client")

from .manifests import CRD_FIELDS, KUBE, MODELS, build, crd_problems, documents, manifest_files

KNOWN = set(MODELS) | set(CRD_FIELDS)


def test_every_manifest_parses_and_every_kind_is_checked() -> None:
    files = manifest_files()
    assert len(files) >= 7, [str(p.relative_to(KUBE)) for p in files]
    kinds = {(d["apiVersion"], d["kind"]) for d in documents()}
    assert kinds <= KNOWN, kinds - KNOWN  # no document escapes both checks
    assert {k for _, k in kinds} >= {
        "Deployment", "StatefulSet", "Service", "ConfigMap", "ServiceAccount", "Role",
        "RoleBinding", "InferencePool", "HTTPRoute", "Gateway",
    }  # fmt: skip


@pytest.mark.parametrize(
    "doc",
    [d for d in documents() if (d["apiVersion"], d["kind"]) in MODELS],
    ids=lambda d: f"{d['kind']}/{d['metadata']['name']}",
)
def test_core_kinds_survive_the_clients_models(doc: dict[str, Any]) -> None:
    assert build(doc) == doc


@pytest.mark.parametrize(
    "doc",
    [d for d in documents() if (d["apiVersion"], d["kind"]) in CRD_FIELDS],
    ids=lambda d: f"{d['kind']}/{d['metadata']['name']}",
)
def test_custom_kinds_use_only_their_upstream_fields(doc: dict[str, Any]) -> None:
    assert crd_problems(doc) == []


def _first(kind: str) -> dict[str, Any]:
    return copy.deepcopy(next(d for d in documents() if d["kind"] == kind))


def test_the_checks_catch_broken_documents() -> None:
    deployment = _first("Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}  # misspelt
    assert build(deployment) != deployment
    del deployment["spec"]["template"]["spec"]["containers"][0]["name"]  # required
    with pytest.raises(ValueError):
        build(deployment)
    pool = _first("InferencePool")
    pool["spec"]["endpointPickerRef"]["portNumber"] = 9002  # a pre-release field name
    assert crd_problems(pool) == ["spec.endpointPickerRef.portNumber"]
    del pool["spec"]["endpointPickerRef"]["port"]
    assert "missing spec.endpointPickerRef.port.number" in crd_problems(pool)
    route = _first("HTTPRoute")
    route["spec"]["rules"][0]["backendRefs"][0]["weigth"] = 1
    assert crd_problems(route) == ["spec.rules[].backendRefs[].weigth"]


def test_the_file_list_skips_only_kustomize_files() -> None:
    skipped = {p for p in KUBE.rglob("*.yaml")} - set(manifest_files())
    assert {p.name for p in skipped} <= {"kustomization.yaml", "two-pickers.yaml"}
    assert all(isinstance(p, Path) for p in skipped)
