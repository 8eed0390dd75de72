"""The replica registry's documented rules that mutation testing found unpinned (issue 16,
docs/mutation.md): replica names and URLs (docs/gateway.md "Replica names",
``normalize_url``), the admin view (``describe``), in-flight counts, the reasons an ejection
gives, and the error-rate outlier check (gateway/_registry.py's docstring; docs/gateway.md
"Whose fault": 50 points above the peers' pooled rate over 20+ answers in 30 s)."""

from __future__ import annotations

import hashlib
import logging

import pytest

from prefixroute.core import ReplicaId, Router, make_policy
from prefixroute.gateway import GatewayConfig, ReplicaRegistry
from prefixroute.gateway._errors import Conflict, NotFound
from prefixroute.gateway._registry import normalize_url

A, B, C = ReplicaId("http://a:1"), ReplicaId("http://b:2"), ReplicaId("http://c:3")
NEVER_SEEN = ReplicaId("http://z:9")
LOGGER = "prefixroute.gateway._registry"


def registry(*rids: ReplicaId, **settings: object) -> ReplicaRegistry:
    reg = ReplicaRegistry(Router(make_policy("round_robin")), GatewayConfig(**settings))  # type: ignore[arg-type]
    for rid in rids or (A, B):
        reg.add(rid)
    return reg


def sha_name(rid: ReplicaId) -> str:
    # docs/gateway.md: "r-" and 8 hex digits of its URL's SHA-256
    return "r-" + hashlib.sha256(str(rid).encode()).hexdigest()[:8]


def start_request(reg: ReplicaRegistry, rid: ReplicaId, key: str) -> None:
    reg.router.route(reg.router.view(key, text="x"), 0.0, [rid])


def answers(reg: ReplicaRegistry, rid: ReplicaId, ok: int, errors: int, now: float) -> None:
    """Outcomes that only feed the error rate (successes, and failures that are no one's)."""
    for _ in range(ok):
        reg.record_success(rid, now=now)
    for _ in range(errors):
        reg.get(rid).outcomes.append((now, False))  # what record_error adds, before judging


# --- names, URLs, membership ------------------------------------------------------------------


def test_a_replica_is_named_r_and_8_hex_digits_of_its_urls_sha256() -> None:
    reg = registry()
    assert reg.get(A).name == sha_name(A)
    assert len(reg.get(A).name) == 10
    assert reg.public_name(A) == sha_name(A)


def test_the_public_name_of_a_replica_no_longer_registered_is_still_its_hash() -> None:
    # Headers and errors can name a replica after it was removed (a request still in flight).
    reg = registry()
    reg.remove(A)
    assert reg.public_name(A) == sha_name(A)
    assert reg.public_name(NEVER_SEEN) == sha_name(NEVER_SEEN)


def test_a_url_loses_only_its_trailing_slash() -> None:
    assert normalize_url("http://a:1/vllm/") == "http://a:1/vllm"
    assert normalize_url("http://a:1/preX") == "http://a:1/preX"
    assert normalize_url("http://a:1/preX/") == "http://a:1/preX"


def test_no_model_is_an_adapter_before_any_replica_lists_one() -> None:
    assert registry().adapter_of("m") is None


def test_membership_errors_name_the_replica() -> None:
    reg = registry()
    with pytest.raises(Conflict) as twice:
        reg.add("http://a:1/")
    assert str(twice.value) == f"replica {A} is already registered"
    with pytest.raises(NotFound) as missing:
        reg.get(NEVER_SEEN)
    assert str(missing.value) == f"no replica {NEVER_SEEN}"
    with pytest.raises(NotFound) as bad:
        reg.find("ftp://x")
    assert str(bad.value) == "no replica 'ftp://x'"


def test_remove_returns_the_record_it_forgot() -> None:
    reg = registry()
    record = reg.get(A)
    assert reg.remove(A) is record
    assert [r.id for r in reg] == [B]


def test_in_flight_counts_the_replicas_own_requests_and_0_for_strangers() -> None:
    reg = registry()
    start_request(reg, A, "q1")
    assert reg.in_flight(A) == 1
    assert reg.in_flight(B) == 0
    assert reg.in_flight(NEVER_SEEN) == 0
    reg.remove(A)
    assert reg.in_flight(A) == 0  # forgotten: its requests are no longer the registry's


# --- the admin view ---------------------------------------------------------------------------


def test_the_admin_view_lists_url_name_models_load_and_speed() -> None:
    # docs/gateway.md: "The admin API lists both" (the URL and the r- name).
    reg = registry()
    reg.set_models(A, [{"id": "m2"}, {"id": "m1"}])
    start_request(reg, A, "q1")
    speed = reg.router.replica_load(A).speed
    speed.observe_prefill(tokens=1000.0, steps=0.0, ttft_s=0.1)
    view = reg.describe(reg.get(A))
    assert view["id"] == view["url"] == "http://a:1"
    assert view["name"] == sha_name(A)
    assert view["models"] == ["m1", "m2"]  # sorted
    assert view["in_flight"] == 1
    unknown = {"batch_slots": None, "batch_slots_from": None}  # size not known yet
    unknown["preemptions"] = 0  # none scraped
    assert view["speed"] == {**speed.snapshot(), **unknown}
    assert view["speed"]["prefill_observations"] == 1
    assert reg.describe(reg.get(B))["models"] is None  # not known yet


# --- why a replica was taken out --------------------------------------------------------------


def ejections(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "taken out" in r.getMessage()]


def test_each_ejection_says_why(caplog: pytest.LogCaptureFixture) -> None:
    reg = registry(A, B, C, failure_threshold=1)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        reg.record_probe(A, ok=False, now=1.0, first=True)
        reg.record_probe(B, ok=False, now=1.0)
        reg.record_failure(C, now=1.0, why="timeout")
    assert ejections(caplog) == [
        f"replica {A} taken out at registration: its first health probe failed",
        f"replica {B} taken out after 1 failures (health probe failed)",
        f"replica {C} taken out after 1 failures (timeout)",
    ]


def test_an_outlier_ejection_gives_both_error_rates(caplog: pytest.LogCaptureFixture) -> None:
    reg = registry()
    answers(reg, B, ok=20, errors=0, now=1.0)
    answers(reg, A, ok=0, errors=19, now=1.0)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        reg.record_error(A, now=1.0)
    assert ejections(caplog) == [f"replica {A} taken out error rate 100% against its peers' 0%"]


def test_a_first_probe_that_fails_adds_to_the_failures_already_counted() -> None:
    # Failures of requests and probes count alike (the state machine in the docstring).
    reg = registry()
    reg.record_failure(A, now=1.0, why="connect")
    reg.record_probe(A, ok=False, now=2.0, first=True)
    assert (reg.get(A).failures, reg.get(A).total_failures) == (2, 2)


# --- the error-rate outlier -------------------------------------------------------------------


def test_a_replica_exactly_50_points_above_its_peers_is_an_outlier() -> None:
    reg = registry()
    answers(reg, B, ok=20, errors=0, now=1000.0)
    answers(reg, A, ok=10, errors=9, now=1000.0)
    reg.record_error(A, now=1000.0)  # 10 of 20: 50 % against 0 %
    assert not reg.get(A).healthy


def test_failures_that_count_against_a_replica_are_errors_in_its_rate_too() -> None:
    # "every answer is an outcome in a sliding window": record_failure's included.
    reg = registry(failure_threshold=1000)
    answers(reg, B, ok=20, errors=0, now=1000.0)
    for _ in range(19):
        reg.record_failure(A, now=1000.0, why="timeout")
    assert reg.get(A).healthy  # 19 failures of 1000 allowed in a row
    reg.record_error(A, now=1000.0)
    assert not reg.get(A).healthy


def test_the_peers_rate_is_pooled_over_all_of_them() -> None:
    # B fails everything, C nothing: the peers' pooled rate is 50 %.
    reg = registry(A, B, C)
    answers(reg, B, ok=0, errors=20, now=1000.0)
    answers(reg, C, ok=20, errors=0, now=1000.0)
    answers(reg, A, ok=2, errors=17, now=1000.0)
    reg.record_error(A, now=1000.0)  # 18 of 20 = 90 %: only 40 points above 50 %
    assert reg.get(A).healthy
    answers(reg, A, ok=0, errors=79, now=1000.0)
    reg.record_error(A, now=1000.0)  # 98 of 100 = 98 %: 48 points above
    assert reg.get(A).healthy


def test_a_replica_failing_everything_is_out_against_peers_pooled_at_50_percent() -> None:
    reg = registry(A, B, C)
    answers(reg, B, ok=0, errors=20, now=1000.0)
    answers(reg, C, ok=20, errors=0, now=1000.0)
    answers(reg, A, ok=0, errors=19, now=1000.0)
    reg.record_error(A, now=1000.0)  # 100 % against 50 %
    assert not reg.get(A).healthy


def test_answers_count_for_30_s_and_not_after() -> None:
    for now, out in ((1030.0, True), (1030.5, False)):
        reg = registry()
        answers(reg, B, ok=20, errors=0, now=now)  # the peers' answers are fresh
        answers(reg, A, ok=0, errors=19, now=1000.0)
        reg.record_error(A, now=now)
        assert reg.get(A).healthy is not out, now


def test_progress_is_never_for_a_replica_the_registry_does_not_hold() -> None:
    """``progress_at``: 0.0 for never. A request's first-byte watch keeps asking after its
    replica was removed (gateway/_first_byte.py), so an unknown replica is "never", not an
    error."""
    reg = registry(A)
    assert reg.progress_at(A) == 0.0  # never yet
    reg.progressed(A, 12.5)
    reg.progressed(A, 3.0)  # an earlier time does not move it back
    assert reg.progress_at(A) == 12.5
    assert reg.progress_at(NEVER_SEEN) == 0.0
    reg.remove(A)
    assert reg.progress_at(A) == 0.0
