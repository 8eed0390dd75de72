from __future__ import annotations

import pytest

from prefixroute.core import ConfigError, NoReplicaAvailable, ReplicaId, Router, make_policy
from prefixroute.gateway import GatewayConfig, ReplicaRegistry, ReplicaStatus
from prefixroute.gateway._errors import Conflict, ModelNotFound, NotFound, Overloaded
from prefixroute.gateway._registry import normalize_url

A, B = "http://a:1", "http://b:2"


def _registry(**settings: object) -> ReplicaRegistry:
    config = GatewayConfig(failure_threshold=2, eject_s=10.0, **settings)  # type: ignore[arg-type]
    registry = ReplicaRegistry(Router(make_policy("round_robin")), config)
    registry.add(A)
    registry.add(B)
    return registry


def test_urls_are_normalised() -> None:
    assert normalize_url("HTTP://Host:80/") == "http://host:80"
    assert normalize_url("https://h/prefix/") == "https://h/prefix"
    for bad in ("h:80", "ftp://h", "http://h?x=1", "http://"):
        with pytest.raises(Exception, match="replica URL"):
            normalize_url(bad)
    assert normalize_url("http://h:1") == "http://h:1"  # the ports' range, both ends in
    assert normalize_url("http://h:65535") == "http://h:65535"
    for port in ("0", "65536", "99999", "x", "-1"):
        with pytest.raises(ConfigError, match="port must be 1-65535"):
            normalize_url(f"http://127.0.0.1:{port}")
    # Credentials would be the replica's id: in logs and in /metrics' labels.
    for creds in ("u:p@", "u@", ":p@"):
        with pytest.raises(ConfigError, match="no user or password"):
            normalize_url(f"http://{creds}127.0.0.1:8000")


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:18001/v1", "http://h:1/v1/", "https://h/prefix/v1", "http://h/V1/x"]
)
def test_a_replica_url_with_v1_is_refused(url: str) -> None:
    # The gateway adds /v1/... itself: an OpenAI base URL was accepted, then probed at
    # /v1/v1/models, taken out, and every request answered 503.
    with pytest.raises(ConfigError, match=r"without /v1 \(the gateway adds /v1/\.\.\.\), got"):
        normalize_url(url)
    with pytest.raises(ConfigError, match="without /v1"):
        _registry().add(url)


def test_membership_keeps_the_router_in_step() -> None:
    reg = _registry()
    assert reg.router.replicas == [A, B]
    with pytest.raises(Conflict):
        reg.add(A + "/")
    reg.remove(ReplicaId(A))
    assert reg.router.replicas == [B]
    with pytest.raises(NotFound):
        reg.find("http%3A%2F%2Fa%3A1")
    assert reg.find("http%3A%2F%2Fb%3A2").url == B


def test_failures_eject_and_probes_readmit_after_eject_time() -> None:
    reg = _registry()
    a = reg.get(ReplicaId(A))
    reg.record_failure(a.id, now=0.0, why="x")
    reg.record_success(a.id)  # a success resets the count
    reg.record_failure(a.id, now=1.0, why="x")
    assert a.status is ReplicaStatus.HEALTHY
    reg.record_failure(a.id, now=2.0, why="x")
    assert a.status is ReplicaStatus.UNHEALTHY
    assert reg.candidates(None) == [B]
    reg.record_probe(a.id, ok=True, now=5.0)  # too early: out for eject_s
    assert a.status is ReplicaStatus.UNHEALTHY
    reg.record_probe(a.id, ok=True, now=12.5)
    assert a.status is ReplicaStatus.HEALTHY and a.failures == 0


def test_candidates_by_model_health_and_cap() -> None:
    reg = _registry(max_in_flight_per_replica=1)
    reg.set_models(ReplicaId(A), [{"id": "m1"}])
    reg.set_models(ReplicaId(B), [{"id": "m1"}, {"id": "m2"}])
    assert reg.candidates("m2") == [B]
    assert reg.candidates("m1", exclude=[ReplicaId(B)]) == [A]
    with pytest.raises(ModelNotFound):
        reg.candidates("m3")
    reg.drain(ReplicaId(B))
    with pytest.raises(NoReplicaAvailable):
        reg.candidates("m2")
    view = reg.router.view("r1", text="x")
    reg.router.route(view, 0.0, [ReplicaId(A)])
    with pytest.raises(Overloaded):
        reg.candidates("m1")
    reg.router.complete("r1", 1.0)
    assert reg.candidates("m1") == [A]
    assert sorted(c["id"] for c in reg.model_cards()) == ["m1", "m2"]


def test_remove_and_re_add_with_requests_in_flight() -> None:
    reg = _registry()
    a = ReplicaId(A)
    reg.router.route(reg.router.view("r1", text="x"), 0.0, [a])
    reg.remove(a)
    assert a not in reg.router.replicas
    reg.add(A)  # back while "r1" still runs: its completion must not touch the new load
    reg.router.complete("r1", 1.0)
    assert reg.in_flight(a) == 0


def test_an_error_rate_far_above_its_peers_takes_a_replica_out() -> None:
    """Errors no retry judged count only in the error rate: a replica is out once its rate,
    over at least OUTLIER_MIN_REQUESTS answers, stands OUTLIER_MARGIN above its peers'."""
    from prefixroute.gateway._registry import OUTLIER_MIN_REQUESTS

    reg = _registry()
    a, b = ReplicaId(A), ReplicaId(B)
    for i in range(OUTLIER_MIN_REQUESTS):
        reg.record_success(b, now=float(i))
    for i in range(OUTLIER_MIN_REQUESTS - 1):
        reg.record_error(a, now=float(i))
    assert reg.get(a).healthy  # too few answers to judge
    assert reg.get(a).failures == 0  # errors are not consecutive failures
    reg.record_error(a, now=20.0)
    assert not reg.get(a).healthy


def test_errors_shared_with_the_peers_take_no_replica_out() -> None:
    """Every replica failing the same share of requests (client garbage) is not an outlier."""
    reg = _registry()
    a, b = ReplicaId(A), ReplicaId(B)
    for i in range(100):
        for rid in (a, b):
            if i % 2:
                reg.record_error(rid, now=float(i) / 10)
            else:
                reg.record_success(rid, now=float(i) / 10)
    assert reg.get(a).healthy and reg.get(b).healthy


def test_old_errors_leave_the_window() -> None:
    from prefixroute.gateway._registry import OUTLIER_MIN_REQUESTS, OUTLIER_WINDOW_S

    reg = _registry()
    a, b = ReplicaId(A), ReplicaId(B)
    for _ in range(OUTLIER_MIN_REQUESTS - 1):
        reg.record_error(a, now=0.0)
    reg.record_success(b, now=0.0)
    reg.record_error(a, now=OUTLIER_WINDOW_S + 1)  # the others are too old to count
    assert reg.get(a).healthy


def test_requests_waiting_on_a_replica_hear_when_it_is_taken_out() -> None:
    reg = _registry()
    a = ReplicaId(A)
    heard: list[str] = []
    reg.on_ejected(a, lambda: heard.append("first"))
    cancel = reg.on_ejected(a, lambda: heard.append("cancelled"))
    cancel()
    reg.record_failure(a, 0.0, "x")
    assert heard == []  # one failure of two: still in
    reg.record_failure(a, 0.0, "x")
    assert heard == ["first"]


def test_replicas_have_stable_opaque_names() -> None:
    from prefixroute.gateway._registry import replica_name

    reg = _registry()
    record = reg.get(ReplicaId(A))
    assert record.name == replica_name(ReplicaId(A)) and record.name.startswith("r-")
    assert "a:1" not in record.name
    assert reg.public_name(ReplicaId(A)) == record.name
    assert _registry(expose_replica_urls=True).public_name(ReplicaId(A)) == A


def test_adapters_are_the_models_listed_with_a_parent() -> None:
    """vLLM lists a LoRA adapter with its base model's id as ``parent`` (the base: null); the
    gateway keys an adapter's requests apart, and forgets an adapter no replica lists."""
    reg = _registry()
    base = {"id": "llama", "parent": None}
    reg.set_models(ReplicaId(A), [base, {"id": "sql", "parent": "llama"}, {"id": "x"}])
    reg.set_models(ReplicaId(B), [base, {"id": "chat", "parent": "llama"}])
    assert [reg.adapter_of(m) for m in ("sql", "chat", "llama", "x", "other", None)] == [
        "sql", "chat", None, None, None, None,
    ]  # fmt: skip
    reg.set_models(ReplicaId(B), [base, {"id": "odd", "parent": "odd"}, {"id": "e", "parent": ""}])
    assert reg.adapter_of("chat") is None and reg.adapter_of("odd") is None
    assert reg.adapter_of("e") is None
    reg.remove(ReplicaId(A))
    assert reg.adapter_of("sql") is None


def test_each_hook_hears_every_replica_added_after_it() -> None:
    reg = _registry()
    reg.add("http://before:1")
    heard: list[list[str]] = [[], []]
    reg.on_added(heard[0].append)
    reg.on_added(heard[1].append)
    reg.add("http://A:2/")
    with pytest.raises(Conflict):
        reg.add("http://a:2")  # not added: nobody hears of it
    assert heard == [["http://a:2"], ["http://a:2"]]  # the id, normalised


def test_each_hook_hears_of_each_replica_removed_after_the_router_forgot_it() -> None:
    """Precise mode stops a replica's event stream on this hook: it hears the id, and the
    router no longer has the replica (so late events for it are dropped)."""
    reg = _registry()
    reg.add("http://gone:1")
    heard: list[tuple[str, bool]] = []
    reg.on_removed(lambda rid: heard.append((rid, rid in reg.router.replicas)))
    reg.remove(ReplicaId("http://gone:1"))
    assert heard == [("http://gone:1", False)]
