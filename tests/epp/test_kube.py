"""Pod discovery against a fake API: ready pods only, watch events, resync, 410 recovery.

The pods are the ``kubernetes`` client's own models; the last test runs the real client's
``Watch`` over a fake ``list_namespaced_pod`` that answers as the API server does (a list, or a
stream of JSON watch events), so the adapter is checked against the client, not a guess of it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from prefixroute.core import ConfigError, SpeedPrior
from prefixroute.epp import PodEndpoints, pod_info
from prefixroute.epp._kube import KubernetesPods, WatchExpired

client = pytest.importorskip("kubernetes.client")


def pod(
    name: str, ip: str | None = "10.1.0.1", ready: bool = True, deleting: bool = False,
    annotations: dict[str, str] | None = None,
) -> Any:  # fmt: skip
    return client.V1Pod(
        metadata=client.V1ObjectMeta(
            name=name, deletion_timestamp=datetime(2026, 1, 1, tzinfo=UTC) if deleting else None,
            annotations=annotations,
        ),
        status=client.V1PodStatus(
            pod_ip=ip,
            conditions=[client.V1PodCondition(type="Ready", status="True" if ready else "False")],
        ),
    )


def addresses(published: list[list[str]]) -> Callable[[dict[str, SpeedPrior | None]], None]:
    """A publish callback that keeps each endpoint set's addresses, in order."""
    return lambda endpoints: published.append(list(endpoints))


class FakeSource:
    """Scripted lists and watches; a watch step that is an exception is raised."""

    def __init__(self, lists: list[list[Any]], watches: list[list[Any]]) -> None:
        self.lists = lists
        self.watches = watches
        self.versions: list[str] = []

    def list(self) -> tuple[list[Any], str]:
        items = self.lists.pop(0)
        return items, str(len(self.lists))

    def watch(self, resource_version: str, timeout_s: int) -> Iterator[tuple[str, Any]]:
        self.versions.append(resource_version)
        for step in self.watches.pop(0):
            if isinstance(step, BaseException):
                raise step
            yield step


def test_only_ready_networked_live_pods_count() -> None:
    assert pod_info(pod("a")).ready
    assert not pod_info(pod("b", ready=False)).ready
    assert pod_info(pod("c", deleting=True)).deleting
    source = FakeSource(
        [[pod("a", "10.1.0.1"), pod("b", "10.1.0.2", ready=False), pod("c", None),
          pod("d", "10.1.0.4", deleting=True)]],
        [[]],
    )  # fmt: skip
    published: list[list[str]] = []
    PodEndpoints(source, 8000, addresses(published)).cycle()
    assert published == [["10.1.0.1:8000"]]


def test_watch_events_update_the_endpoints() -> None:
    source = FakeSource(
        [[pod("a", "10.1.0.1")]],
        [[("ADDED", pod("b", "10.1.0.2", ready=False)),
          ("MODIFIED", pod("b", "10.1.0.2")),
          ("MODIFIED", pod("a", "10.1.0.1", deleting=True)),
          ("DELETED", pod("a", "10.1.0.1"))]],
    )  # fmt: skip
    published: list[list[str]] = []
    PodEndpoints(source, 9000, addresses(published)).cycle()
    assert published == [["10.1.0.1:9000"], ["10.1.0.1:9000", "10.1.0.2:9000"], ["10.1.0.2:9000"]]
    assert source.versions == ["0"]  # watched from the list's resourceVersion


def test_an_expired_watch_and_a_resync_relist() -> None:
    """A pod deleted while nobody watched disappears at the next list."""
    source = FakeSource(
        [[pod("a", "10.1.0.1"), pod("b", "10.1.0.2")], [pod("b", "10.1.0.2")]],
        [[WatchExpired("too old")], []],
    )
    published: list[list[str]] = []
    watcher = PodEndpoints(source, 80, addresses(published))
    watcher.cycle()
    watcher.cycle()
    assert watcher.lists == 2
    assert published == [["10.1.0.1:80", "10.1.0.2:80"], ["10.1.0.2:80"]]


def test_the_thread_survives_api_failures() -> None:
    class Flaky(FakeSource):
        def list(self) -> tuple[list[Any], str]:
            if not self.versions and not getattr(self, "failed", False):
                self.failed = True
                raise ConnectionError("API server restarting")
            return super().list()

    source = Flaky([[pod("a")]], [[]])
    published: list[list[str]] = []
    watcher = PodEndpoints(source, 80, addresses(published), backoff_s=0.0)
    watcher._stop.set()  # one _run pass would loop; drive it by hand instead
    with pytest.raises(ConnectionError):
        watcher.cycle()
    watcher.cycle()
    assert published == [["10.1.0.1:80"]]


class _Stream:
    """What the client's Watch reads: a urllib3 response streaming JSON lines."""

    def __init__(self, lines: list[dict[str, Any]]) -> None:
        self.data = [json.dumps(line).encode() + b"\n" for line in lines]

    def stream(self, amt: Any = None, decode_content: bool = False) -> Iterator[bytes]:
        yield from self.data

    def close(self) -> None: ...

    def release_conn(self) -> None: ...


def _raw(name: str, ip: str, ready: bool) -> dict[str, Any]:
    return {
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {"name": name, "resourceVersion": "7"},
        "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": str(ready)}]},
    }  # fmt: skip


class FakeCoreV1:
    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events
        self.calls: list[dict[str, Any]] = []

    def list_namespaced_pod(self, namespace: str, **kw: Any) -> Any:
        """A fake of the client's method (Watch reads the return type from this docstring).

        :rtype: V1PodList
        """
        self.calls.append({"namespace": namespace, **kw})
        if kw.get("watch"):
            return _Stream(self.events)
        return client.V1PodList(
            items=[pod("a", "10.1.0.1")], metadata=client.V1ListMeta(resource_version="5")
        )


def test_the_real_client_watch_over_a_fake_api_server() -> None:
    api = FakeCoreV1([
        {"type": "ADDED", "object": _raw("b", "10.1.0.2", True)},
        {"type": "ERROR",
         "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}},
    ])  # fmt: skip
    source = KubernetesPods("inference", "app=vllm", api=api)
    published: list[list[str]] = []
    PodEndpoints(source, 8000, addresses(published), resync_s=30).cycle()
    assert published == [["10.1.0.1:8000"], ["10.1.0.1:8000", "10.1.0.2:8000"]]
    # With timeout_seconds the client ends the watch at a 410 (no retry of its own): the
    # cycle returns and the next one lists again.
    listed, watched = api.calls
    assert listed == {"namespace": "inference", "label_selector": "app=vllm"}
    assert watched["resource_version"] == "5" and watched["timeout_seconds"] == 30
    assert watched["label_selector"] == "app=vllm"


@pytest.mark.parametrize(
    "kubeconfig",
    [None, "garbage: [\n", "foo: 1\n"],
    ids=["none", "not YAML", "no current context"],
)
def test_no_usable_cluster_config_is_a_config_error(
    kubeconfig: str | None, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Outside a pod and without a kubeconfig the client raised its own exception, which the
    # command line printed as a traceback; it is a one-line configuration error.
    path = tmp_path / "kubeconfig"
    if kubeconfig is not None:
        path.write_text(kubeconfig)
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigError, match="^--k8s-selector: not in a pod") as refused:
        KubernetesPods("default", "app=vllm")
    assert "\n" not in str(refused.value)


def test_a_pod_s_annotations_give_its_own_speed_priors(caplog: pytest.LogCaptureFixture) -> None:
    """A pool mixing GPU generations: the faster pods say so in annotations, and the endpoint
    set carries their priors; a pod whose annotation is no speed serves at the fleet's, and
    why is logged once, not at every event."""
    fast = {"prefixroute.io/prefill-tokens-per-s": "40000", "prefixroute.io/decode-step-s": "0.01"}
    bad = {"prefixroute.io/prefill-tokens-per-s": "fast"}
    source = FakeSource(
        [[pod("a", "10.1.0.1", annotations=fast), pod("b", "10.1.0.2"),
          pod("c", "10.1.0.3", annotations=bad)]],
        [[("MODIFIED", pod("c", "10.1.0.3", annotations=bad))]],
    )  # fmt: skip
    published: list[dict[str, SpeedPrior | None]] = []
    with caplog.at_level(logging.WARNING, logger="prefixroute.epp._kube"):
        PodEndpoints(source, 8000, published.append).cycle()
    assert published == [{
        "10.1.0.1:8000": SpeedPrior(prefill_tokens_per_s=40_000.0, decode_step_s=0.01),
        "10.1.0.2:8000": None,
        "10.1.0.3:8000": None,
    }]  # fmt: skip
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "pod c" in warned[0] and "fast" in warned[0]
    zero = {"prefixroute.io/prefill-tokens-per-s": "0"}  # a number, but no speed
    assert pod_info(pod("d", annotations=zero)).speed is None


def test_a_pod_s_batch_size_annotation_is_told_and_a_part_one_refused() -> None:
    sized = {"prefixroute.io/max-running": "64"}
    assert pod_info(pod("e", annotations=sized)).speed == SpeedPrior(max_running=64)
    half = {"prefixroute.io/max-running": "6.5"}
    assert pod_info(pod("f", annotations=half)).speed is None  # logged, the pod still serves
