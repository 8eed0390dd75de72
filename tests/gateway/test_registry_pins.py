"""The replica registry's health rules at their edges (gateway/_registry.py's docstring,
README "Health"; docs/mutation.md): a replica whose first probe fails starts out and comes in
with its first successful probe; failures of probes count like failures of requests; the admin
view counts them; the errors say why no replica could be chosen."""

from __future__ import annotations

import pytest

from prefixroute.core import NoReplicaAvailable, ReplicaId, Router, make_policy
from prefixroute.gateway import GatewayConfig, ReplicaRegistry, ReplicaStatus
from prefixroute.gateway._errors import ModelNotFound, NotFound, Overloaded

A, B = ReplicaId("http://a:1"), ReplicaId("http://b:2")


def registry(**settings: object) -> ReplicaRegistry:
    reg = ReplicaRegistry(Router(make_policy("round_robin")), GatewayConfig(**settings))  # type: ignore[arg-type]
    reg.add(A)
    reg.add(B)
    return reg


def counts(reg: ReplicaRegistry, rid: ReplicaId) -> tuple[str, int, int]:
    view = reg.describe(reg.get(rid))
    return view["status"], view["consecutive_failures"], view["total_failures"]


def test_a_replica_whose_first_probe_fails_starts_out_and_comes_in_with_a_good_probe() -> None:
    reg = registry()
    reg.record_probe(A, ok=False, now=100.0, first=True)
    assert counts(reg, A) == ("unhealthy", 1, 1)
    assert reg.candidates(None) == [B]
    reg.record_probe(A, ok=True, now=100.5)  # no eject_s wait: it was never serving
    assert counts(reg, A) == ("healthy", 0, 1)
    assert reg.describe(reg.get(A))["ejections"] == 1  # its start out counts once
    for t in (101.0, 102.0, 103.0):
        reg.record_failure(A, now=t, why="test")
    assert reg.describe(reg.get(A))["ejections"] == 2


def test_a_later_failed_probe_is_one_failure_like_a_request_failure() -> None:
    reg = registry()
    reg.record_probe(A, ok=False, now=1.0)  # not the first probe: one failure of three
    assert counts(reg, A) == ("healthy", 1, 1)
    reg.record_failure(A, now=2.0, why="test")
    reg.record_probe(A, ok=False, now=3.0)
    assert counts(reg, A) == ("unhealthy", 3, 3)
    reg.record_success(A)
    reg.record_failure(A, now=4.0, why="test")
    assert counts(reg, A) == ("unhealthy", 1, 4)  # total failures never reset


def test_why_no_replica_could_be_chosen() -> None:
    reg = registry(max_in_flight_per_replica=1)
    reg.set_models(A, [{"id": "m"}])
    reg.set_models(B, [{"id": "m"}])
    with pytest.raises(ModelNotFound) as missing:
        reg.candidates("other<script>")
    # Says what is wrong, without repeating the client's bytes (docs/security.md)
    assert str(missing.value) == (
        "the requested model is not served by any replica (GET /v1/models lists them)"
    )
    for rid in (A, B):
        reg.router.route(reg.router.view(f"q{rid}", text="x"), 0.0, [rid])
    with pytest.raises(Overloaded) as full:
        reg.candidates("m")
    assert str(full.value) == "every replica is at its in-flight limit; retry later"
    reg.drain(A)
    reg.drain(B)
    with pytest.raises(NoReplicaAvailable) as none:
        reg.candidates("m")
    assert str(none.value) == "no healthy replica available for this request"
    assert reg.get(A).status is ReplicaStatus.DRAINING


def test_an_admin_path_finds_a_replica_by_its_name_or_its_quoted_url() -> None:
    """docs/gateway.md, Admin API: ``{ref}`` is the listed name or the URL, quoted or not."""
    reg = registry()
    a, b = reg.get(A), reg.get(B)
    assert a.name != b.name and a.name.startswith("r-")
    assert reg.find(a.name) is a and reg.find(b.name) is b
    assert reg.find("http%3A%2F%2Fb%3A2") is b and reg.find("http://a:1/") is a
    for missing in ("r-00000000", "http://c:3", "not a url"):
        with pytest.raises(NotFound):
            reg.find(missing)


def test_an_empty_model_name_is_no_model_named() -> None:
    """vLLM serves its default model for ``"model": ""`` (``_is_model_supported``: an empty
    name is supported), so the gateway routes it like a request that names none."""
    reg = registry()
    reg.set_models(A, [{"id": "m"}])
    reg.set_models(B, [{"id": "m"}])
    assert sorted(reg.candidates("")) == sorted(reg.candidates(None)) == sorted([A, B])


def test_a_v1_in_a_replica_url_is_refused_in_words_that_say_why() -> None:
    from prefixroute.core import ConfigError
    from prefixroute.gateway._registry import normalize_url

    with pytest.raises(ConfigError) as refused:
        normalize_url("http://h:8000/v1")
    assert str(refused.value) == (
        "a replica URL must be http(s)://host[:port] without /v1 (the gateway adds /v1/...), "
        "got 'http://h:8000/v1'"
    )
    assert normalize_url("http://h:8000/vllm/") == "http://h:8000/vllm"  # a prefix is kept
