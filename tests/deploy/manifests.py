"""The deployment files under deploy/kubernetes/, read without a cluster.

- :func:`documents` parses every YAML file (every document in it).
- :func:`build` turns a core or RBAC document into the ``kubernetes`` client's model and back:
  the model's constructor refuses a missing required field, and a misspelt or misplaced field
  is dropped by it, so the round trip differs from the file.
- :func:`assemble` does what ``kubectl kustomize`` does with the few features these
  kustomizations use (``resources``, ``namespace``, ``images``, JSON ``patches``), so the
  overlays are checked where no kubectl is installed; where one is, the tests compare the two.
- ``CRD_FIELDS``: the fields of the custom kinds, from their upstream Go types (cited there).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
OVERLAYS = sorted(p.parent for p in (KUBE / "overlays").glob("*/kustomization.yaml"))
KUSTOMIZATION = "kustomization.yaml"

# (apiVersion, kind) -> the kubernetes client's model.
MODELS = {
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("v1", "Service"): "V1Service",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("apps/v1", "StatefulSet"): "V1StatefulSet",
    ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding",
}

# The custom kinds' fields, by path, as their Go types name them (json tags). Every key a
# document uses must be listed; ``REQUIRED`` ones must be there.
# - InferencePool: gateway-api-inference-extension api/v1/inferencepool_types.go and
#   shared_types.go (InferencePoolSpec, Port, EndpointPickerRef, LabelSelector).
# - Gateway, HTTPRoute: gateway-api apis/v1/gateway_types.go, httproute_types.go.
CRD_FIELDS: dict[tuple[str, str], dict[str, set[str]]] = {
    ("inference.networking.k8s.io/v1", "InferencePool"): {
        "spec": {"selector", "targetPorts", "appProtocol", "endpointPickerRef"},
        "spec.selector": {"matchLabels"},
        "spec.targetPorts[]": {"number"},
        "spec.endpointPickerRef": {"group", "kind", "name", "port", "failureMode"},
        "spec.endpointPickerRef.port": {"number"},
    },
    ("gateway.networking.k8s.io/v1", "Gateway"): {
        "spec": {"gatewayClassName", "listeners", "addresses", "infrastructure", "backendTLS"},
        "spec.listeners[]": {"name", "hostname", "port", "protocol", "tls", "allowedRoutes"},
        "spec.listeners[].allowedRoutes": {"namespaces", "kinds"},
        "spec.listeners[].allowedRoutes.namespaces": {"from", "selector"},
        "spec.listeners[].allowedRoutes.kinds[]": {"group", "kind"},
    },
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): {
        "spec": {"parentRefs", "hostnames", "rules"},
        "spec.parentRefs[]": {"group", "kind", "namespace", "name", "sectionName", "port"},
        "spec.rules[]": {
            "name",
            "matches",
            "filters",
            "backendRefs",
            "timeouts",
            "retry",
            "sessionPersistence",
        },  # fmt: skip
        "spec.rules[].matches[]": {"path", "headers", "queryParams", "method"},
        "spec.rules[].matches[].path": {"type", "value"},
        "spec.rules[].backendRefs[]": {
            "group",
            "kind",
            "name",
            "namespace",
            "port",
            "weight",
            "filters",
        },  # fmt: skip
        "spec.rules[].timeouts": {"request", "backendRequest"},
    },
}
REQUIRED: dict[str, set[str]] = {
    "InferencePool": {
        "spec.selector.matchLabels",
        "spec.targetPorts[].number",
        "spec.endpointPickerRef.name",
        "spec.endpointPickerRef.port.number",  # required when the kind is Service (CEL rule)
    },  # fmt: skip
    "Gateway": {
        "spec.gatewayClassName",
        "spec.listeners[].name",
        "spec.listeners[].port",
        "spec.listeners[].protocol",
    },  # fmt: skip
    "HTTPRoute": {"spec.parentRefs[].name", "spec.rules[].backendRefs[].name"},
}


def load(path: Path) -> list[Any]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def manifest_files() -> list[Path]:
    """Every YAML file of resources (kustomizations and JSON patches, lists, left out)."""
    return [
        p
        for p in sorted(KUBE.rglob("*.yaml"))
        if p.name != KUSTOMIZATION and all(isinstance(d, dict) for d in load(p))
    ]


def documents() -> list[dict[str, Any]]:
    return [doc for path in manifest_files() for doc in load(path)]


def build(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` through its client model and back (raises on a missing required field)."""
    import kubernetes.client

    api = kubernetes.client.ApiClient()
    model = MODELS[(doc["apiVersion"], doc["kind"])]
    obj = api.deserialize(json.dumps(doc), model, "application/json")
    out: dict[str, Any] = api.sanitize_for_serialization(obj)
    return out


def crd_problems(doc: dict[str, Any]) -> list[str]:
    """Keys a custom document has that its kind does not, and required ones it lacks."""
    fields = CRD_FIELDS[(doc["apiVersion"], doc["kind"])]
    problems = [
        f"{path}.{key}"
        for path, value in _walk(doc["spec"], "spec")
        if path in fields and isinstance(value, dict)
        for key in value
        if key not in fields[path]
    ]
    present = {path for path, _ in _walk(doc["spec"], "spec")}
    problems += [f"missing {r}" for r in REQUIRED[doc["kind"]] if r not in present]
    return problems


def _walk(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    """(path, value) for every node; list items share the path ``name[]``."""
    yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(item, f"{path}.{key}")
    elif isinstance(value, list):
        for item in value:
            yield from _walk(item, f"{path}[]")


# --- kustomize, the subset used here -----------------------------------------------------


def kustomization(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((folder / KUSTOMIZATION).read_text())
    return data


def assemble(folder: Path) -> list[dict[str, Any]]:
    """The documents ``kubectl kustomize folder`` would print (order aside)."""
    spec = kustomization(folder)
    docs: list[dict[str, Any]] = []
    for entry in spec.get("resources", []):
        target = (folder / entry).resolve()
        docs += assemble(target) if target.is_dir() else copy.deepcopy(load(target))
    for patch in spec.get("patches", []):
        matches = [d for d in docs if targets(patch["target"], d)]
        assert len(matches) == 1, f"{folder}: patch {patch['path']} matches {len(matches)}"
        for op in yaml.safe_load((folder / patch["path"]).read_text()):
            json_patch(matches[0], op)
    for image in spec.get("images", []):
        for container in _containers(docs):
            name, _, _ = container["image"].partition(":")
            if name == image["name"]:
                container["image"] = f"{image.get('newName', name)}:{image['newTag']}"
    if "namespace" in spec:
        for doc in docs:
            doc["metadata"]["namespace"] = spec["namespace"]
            for subject in doc.get("subjects", []):
                if subject["kind"] == "ServiceAccount":
                    subject["namespace"] = spec["namespace"]
    return docs


def targets(selector: dict[str, str], doc: dict[str, Any]) -> bool:
    group, _, version = doc["apiVersion"].rpartition("/")
    actual = {"group": group, "version": version, "kind": doc["kind"]}
    actual["name"] = doc["metadata"]["name"]
    return all(actual[key] == value for key, value in selector.items())


def json_patch(doc: dict[str, Any], op: dict[str, Any]) -> None:
    """One RFC 6902 ``add`` or ``replace``; the path must exist (its parent, for ``add``)."""
    *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"][1:].split("/")]
    node: Any = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if op["op"] == "replace":
        if isinstance(node, list):
            node[int(last)] = op["value"]
        else:
            assert last in node, f"replace of a missing {op['path']}"
            node[last] = op["value"]
    elif op["op"] == "add":
        if isinstance(node, list):
            node.insert(len(node) if last == "-" else int(last), op["value"])
        else:
            node[last] = op["value"]
    else:
        raise AssertionError(f"unsupported patch op {op['op']}")


def _containers(docs: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for doc in docs:
        if doc["kind"] in ("Deployment", "StatefulSet"):
            yield from doc["spec"]["template"]["spec"]["containers"]


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}
