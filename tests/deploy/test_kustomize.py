"""The kustomize base and overlays under deploy/kubernetes/ hold together.

Every kustomization lists files and folders that exist, every patch targets exactly one
resource and every path it touches exists (``manifests.assemble`` asserts both). Where
``kubectl`` is installed, its own ``kubectl kustomize`` must print the same documents as
``assemble`` does: then the other tests, which check ``assemble``'s output, check kustomize's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from .manifests import KUBE, KUSTOMIZATION, OVERLAYS, assemble, json_patch, kustomization

KUSTOMIZATIONS = sorted(p.parent for p in KUBE.rglob(KUSTOMIZATION))


def canonical(docs: list[dict[str, Any]]) -> list[str]:
    return sorted(json.dumps(d, sort_keys=True) for d in docs)


@pytest.mark.parametrize("folder", KUSTOMIZATIONS, ids=lambda p: str(p.relative_to(KUBE)))
def test_every_listed_resource_and_patch_exists(folder: Path) -> None:
    spec = kustomization(folder)
    assert spec["kind"] == "Kustomization"
    assert set(spec) <= {"apiVersion", "kind", "namespace", "resources", "images", "patches"}
    for entry in spec["resources"]:
        target = folder / entry
        assert target.is_file() or (target / KUSTOMIZATION).is_file(), entry
    for patch in spec.get("patches", []):
        assert (folder / patch["path"]).is_file(), patch["path"]


def test_the_overlays_are_serve_epp_and_two_kinds_of_two_pickers() -> None:
    assert [p.name for p in OVERLAYS] == ["epp", "epp-ha", "epp-leader", "serve"]
    ha = assemble(KUBE / "overlays" / "epp-ha")
    picker = next(d for d in ha if d["metadata"]["name"] == "prefixroute-epp" and
                  d["kind"] == "Deployment")  # fmt: skip
    assert picker["spec"]["replicas"] == 2
    assert (
        "--sync-redis=redis://prefixroute-redis:6379/0"
        in (picker["spec"]["template"]["spec"]["containers"][0]["args"])
    )
    env = picker["spec"]["template"]["spec"]["containers"][0]["env"]
    secret = {"name": "prefixroute-sync", "key": "secret"}
    assert {"name": "PREFIXROUTE_SYNC_SECRET", "valueFrom": {"secretKeyRef": secret}} in env
    assert {d["metadata"].get("namespace") for d in ha} == {"inference"}
    leader = assemble(KUBE / "overlays" / "epp-leader")
    picker = next(d for d in leader if d["metadata"]["name"] == "prefixroute-epp" and
                  d["kind"] == "Deployment")  # fmt: skip
    assert picker["spec"]["replicas"] == 2
    args = picker["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--ha-enable-leader-election" in args and not any("redis" in a for a in args)
    assert {d["metadata"].get("namespace") for d in leader} == {"inference"}


def test_a_patch_of_a_missing_path_or_resource_fails() -> None:
    doc: dict[str, Any] = {"spec": {"template": {"spec": {"containers": [{"args": []}]}}}}
    with pytest.raises(KeyError):
        json_patch(doc, {"op": "add", "path": "/spec/template/spec/volumes/0/name", "value": 1})
    with pytest.raises(AssertionError):
        json_patch(doc, {"op": "replace", "path": "/spec/replicas", "value": 2})


def test_a_patch_that_targets_nothing_fails(tmp_path: Path) -> None:
    shutil.copytree(KUBE, tmp_path / "kubernetes")
    overlay = tmp_path / "kubernetes" / "overlays" / "epp-ha"
    spec = kustomization(overlay)
    spec["patches"][0]["target"]["name"] = "prefixroute-picker"
    (overlay / KUSTOMIZATION).write_text(yaml.safe_dump(spec))
    with pytest.raises(AssertionError, match="matches 0"):
        assemble(overlay)


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_kubectl_kustomize_agrees(overlay: Path) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl here: the overlays are checked by assemble() alone")
    out = subprocess.run(
        [kubectl, "kustomize", str(overlay)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    built = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert canonical(built) == canonical(assemble(overlay))
