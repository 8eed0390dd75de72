"""Endpoints from an ``InferencePool`` (``--pool-name``), as the reference picker finds them.

From the spec (``epp/_pool.py``, the Inference Extension's v1 and v1alpha2 pool types): the
pool's labels select the pods, each ready pod is an endpoint at each target port, the pool is
read again at every full list so a changed selector or port is followed, a pool that cannot be
read keeps the last endpoints and says why in one line.
"""

from __future__ import annotations

import argparse
import logging
import time
from typing import Any

import pytest

from prefixroute.core import ConfigError
from prefixroute.epp import InferencePoolPods, PodEndpoints, pool_members

from .test_kube import FakeCoreV1, _raw, client

V1 = "inference.networking.k8s.io"
V1ALPHA2 = "inference.networking.x-k8s.io"


def v1_pool(labels: dict[str, str], ports: list[int], name: str = "vllm-pool") -> dict[str, Any]:
    return {"apiVersion": f"{V1}/v1", "kind": "InferencePool", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": labels},
                     "targetPorts": [{"number": p} for p in ports],
                     "endpointPickerRef": {"name": "epp", "port": {"number": 9002}}}}  # fmt: skip


class FakeCustom:
    """``CustomObjectsApi.get_namespaced_custom_object`` over a dict of pools."""

    def __init__(self, pools: dict[tuple[str, str, str, str], dict[str, Any]]) -> None:
        self.pools = pools
        self.calls: list[tuple[str, ...]] = []

    def get_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str
    ) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        self.calls.append((group, version, namespace, plural, name))
        assert plural == "inferencepools"
        try:
            return self.pools[(group, version, namespace, name)]
        except KeyError:
            raise ApiException(status=404, reason="Not Found") from None


def test_pool_members_of_both_versions() -> None:
    pool = v1_pool({"model": "qwen", "app": "vllm"}, [8000, 8001])
    assert pool_members(pool, V1) == ("app=vllm,model=qwen", (8000, 8001))
    alpha = {"metadata": {"name": "p"}, "spec": {"selector": {"app": "sglang"},
                                                 "targetPortNumber": 30000}}  # fmt: skip
    assert pool_members(alpha, V1ALPHA2) == ("app=sglang", (30000,))
    with pytest.raises(Exception, match="InferencePool p selects no pods"):
        pool_members({"metadata": {"name": "p"}, "spec": {"targetPorts": [{"number": 1}]}}, V1)
    with pytest.raises(Exception, match="InferencePool vllm-pool has no target port"):
        pool_members(v1_pool({"app": "vllm"}, []), V1)
    with pytest.raises(Exception, match="selects no pods"):  # v1 fields under the alpha group
        pool_members(v1_pool({"app": "vllm"}, [8000]), V1ALPHA2)


def test_the_pools_pods_at_each_port_and_a_changed_pool_followed() -> None:
    core = FakeCoreV1([])
    custom = FakeCustom({(V1, "v1", "team", "vllm-pool"): v1_pool({"app": "vllm"}, [8000, 8001])})
    source = InferencePoolPods("team", "vllm-pool", api=core, custom=custom)
    published: list[list[str]] = []
    watcher = PodEndpoints(source, None, lambda e: published.append(list(e)))
    watcher.relist()
    assert custom.calls == [(V1, "v1", "team", "inferencepools", "vllm-pool")]
    assert core.calls[-1] == {"namespace": "team", "label_selector": "app=vllm"}
    assert published == [["10.1.0.1:8000", "10.1.0.1:8001"]]
    # The operator moves the pool to another port and label: the next full list follows.
    custom.pools[(V1, "v1", "team", "vllm-pool")] = v1_pool({"app": "vllm-v2"}, [9000])
    watcher.relist()
    assert core.calls[-1]["label_selector"] == "app=vllm-v2"
    assert published[-1] == ["10.1.0.1:9000"]


def test_the_real_client_watch_uses_the_pools_selector() -> None:
    core = FakeCoreV1([{"type": "ADDED", "object": _raw("b", "10.1.0.2", True)}])
    alpha = {"metadata": {"name": "p"},
             "spec": {"selector": {"app": "sglang"}, "targetPortNumber": 30000}}  # fmt: skip
    custom = FakeCustom({(V1ALPHA2, "v1alpha2", "team", "p"): alpha})
    source = InferencePoolPods("team", "p", group=V1ALPHA2, api=core, custom=custom)
    published: list[list[str]] = []
    PodEndpoints(source, None, lambda e: published.append(list(e))).cycle()
    assert core.calls[-1]["label_selector"] == "app=sglang" and core.calls[-1]["watch"]
    assert published == [["10.1.0.1:30000"], ["10.1.0.1:30000", "10.1.0.2:30000"]]


def test_a_missing_pool_keeps_the_endpoints_and_says_so_in_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    custom = FakeCustom({(V1, "v1", "team", "vllm-pool"): v1_pool({"app": "vllm"}, [8000])})
    source = InferencePoolPods("team", "vllm-pool", api=FakeCoreV1([]), custom=custom)
    published: list[list[str]] = []
    watcher = PodEndpoints(source, None, lambda e: published.append(list(e)), backoff_s=0.01)
    watcher.relist()
    del custom.pools[(V1, "v1", "team", "vllm-pool")]
    calls = len(custom.calls)
    with caplog.at_level(logging.WARNING, "prefixroute.epp._kube"):
        watcher.start()
        deadline = time.monotonic() + 10
        while len(custom.calls) < calls + 2 and time.monotonic() < deadline:  # it keeps retrying
            time.sleep(0.005)
        watcher.stop()
    assert len(custom.calls) >= calls + 2
    assert published == [["10.1.0.1:8000"]]  # nothing withdrawn
    warned = [r for r in caplog.records if "InferencePool team/vllm-pool" in r.getMessage()]
    assert warned and all(r.exc_info is None for r in warned)
    assert "404 Not Found" in warned[0].getMessage()


def test_an_unknown_group_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="not an InferencePool group"):
        InferencePoolPods("team", "p", group="example.com", api=FakeCoreV1([]), custom=object())


def parse(*argv: str) -> argparse.Namespace:
    from prefixroute.commands.epp import add_parser

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    return parser.parse_args(["epp", *argv])


def test_the_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    from prefixroute.commands.epp import _pod_source, config_from_args

    with pytest.raises(ConfigError, match="--k8s-selector or --pool-name, not both"):
        config_from_args(parse("--pool-name", "p", "--k8s-selector", "app=x"))
    with pytest.raises(ConfigError, match="drop --k8s-target-port"):
        config_from_args(parse("--pool-name", "p", "--k8s-target-port", "8000"))
    # Speed priors for an endpoint the pool may bring later are kept, not refused as a typo.
    speed = "10.0.0.9:8000=prefill_tokens_per_s=5000"
    config_from_args(parse("--pool-name", "p", "--replica-speed", speed))

    monkeypatch.setattr("prefixroute.epp._kube._default_api", lambda: FakeCoreV1([]))
    monkeypatch.setattr(client, "CustomObjectsApi", lambda: FakeCustom({}))
    monkeypatch.setenv("NAMESPACE", "from-env")  # the reference chart's way to say it
    found = _pod_source(parse("--pool-name", "p", "--k8s-namespace", "flag"))
    assert found is not None and found[0].namespace == "from-env" and found[1] is None
    assert found[2] == "the pods of InferencePool from-env/p"
    found = _pod_source(parse("--pool-name", "p", "--pool-namespace", "given"))
    assert found is not None and found[0].namespace == "given"
    monkeypatch.delenv("NAMESPACE")
    found = _pod_source(parse("--pool-name", "p", "--k8s-namespace", "flag"))
    assert found is not None and found[0].namespace == "flag"
