"""The Kubernetes manifests under deploy/kubernetes/, checked without a cluster.

Each document is parsed, and each kind the ``kubernetes`` client has a model for is built with
that model and written back: a misspelt or misplaced field is dropped by the model, so the
round trip differs from the file. The InferencePool (a CRD) gets its required fields checked by
hand, against the protocol's port.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from prefixroute.epp._protocol import HEALTH_SERVICES

yaml = pytest.importorskip("yaml")
kubernetes = pytest.importorskip("kubernetes.client")

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
MODELS = {
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("v1", "Service"): "V1Service",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding",
}


def documents() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(DEPLOY.rglob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def test_every_core_document_survives_the_clients_models() -> None:
    api = kubernetes.ApiClient()
    built = 0
    for doc in documents():
        model = MODELS.get((doc["apiVersion"], doc["kind"]))
        if model is None:
            continue
        obj = api.deserialize(json.dumps(doc), model, "application/json")
        assert api.sanitize_for_serialization(obj) == doc, doc["kind"]
        built += 1
    assert built == 5


def test_the_pool_and_the_picker_agree() -> None:
    docs = {d["kind"]: d for d in documents()}
    pool = docs["InferencePool"]["spec"]
    assert pool["endpointPickerRef"]["name"] == docs["Service"]["metadata"]["name"]
    assert pool["endpointPickerRef"]["port"]["number"] == 9002
    container = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args[0] == "epp" and "--grpc-port=9002" in args
    assert "--k8s-selector=app=vllm" in args and pool["selector"]["matchLabels"] == {"app": "vllm"}
    assert f"--k8s-target-port={pool['targetPorts'][0]['number']}" in args
    assert container["readinessProbe"]["grpc"]["service"] in HEALTH_SERVICES
    rules = docs["Role"]["rules"][0]
    assert set(rules["verbs"]) >= {"list", "watch"} and rules["resources"] == ["pods"]
