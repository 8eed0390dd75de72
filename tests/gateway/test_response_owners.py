"""The stored responses' owners kept per tenant (gateway/_responses.py's docstring).

From it: the map keeps the latest ``OWNERS_KEPT`` ids; past that, a tenant holding more than its
share (the capacity over the tenants holding ids) forgets its own oldest, not the oldest of all,
so one tenant's flood cannot push the others' ids out (an outside audit's lead, 2026-12-07).
With one tenant (no tenancy) it is the plain LRU it was.
"""

from __future__ import annotations

from prefixroute.core import ReplicaId
from prefixroute.gateway._responses import ResponseOwners

R = ReplicaId("http://r:1")


def test_one_tenant_s_flood_leaves_the_others_ids() -> None:
    owners = ResponseOwners(capacity=10)
    for i in range(4):
        owners.record("quiet", f"resp_q{i}", R)
    for i in range(1000):
        owners.record("loud", f"resp_l{i}", R)
    assert all(owners.owner("quiet", f"resp_q{i}") == R for i in range(4))
    assert len(owners) == 10
    # The flood keeps its latest, as many as fit beside the others'.
    assert [owners.owner("loud", f"resp_l{i}") for i in range(994, 1000)] == [R] * 6
    assert owners.owner("loud", "resp_l993") is None


def test_within_its_share_a_tenant_pushes_out_the_oldest_of_all() -> None:
    owners = ResponseOwners(capacity=4)
    owners.record("a", "resp_a0", R)
    owners.record("a", "resp_a1", R)
    owners.record("a", "resp_a2", R)
    owners.record("b", "resp_b0", R)
    owners.record("b", "resp_b1", R)  # b holds 2, its share (4 // 2): a's oldest goes
    assert owners.owner("a", "resp_a0") is None
    assert owners.owner("b", "resp_b0") == R and owners.owner("a", "resp_a1") == R


def test_without_tenants_it_is_a_plain_lru() -> None:
    owners = ResponseOwners(capacity=3)
    for i in range(5):
        owners.record(None, f"resp_{i}", R)
    owners.record(None, "resp_2", R)  # answered again: the latest
    owners.record(None, "resp_5", R)
    assert [owners.owner(None, f"resp_{i}") for i in range(6)] == [None, None, R, None, R, R]


def test_a_tiny_map_keeps_the_latest_answer() -> None:
    owners = ResponseOwners(capacity=1)
    owners.record("a", "resp_a", R)
    owners.record("b", "resp_b", R)
    assert owners.owner("b", "resp_b") == R and len(owners) == 1
