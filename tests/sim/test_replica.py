"""The replica model: prefill timing, cache hits at admission, batching, eviction, queueing."""

from __future__ import annotations

import pytest

from prefixroute.core import ConfigError, RequestTooLarge
from prefixroute.sim.replica import EngineRequest, ReplicaConfig, ReplicaModel, StepResult


def drive(model: ReplicaModel, now: float = 0.0) -> tuple[float, list[StepResult]]:
    results = []
    while model.has_work():
        d = model.begin_step(now)
        assert d > 0
        now += d
        results.append(model.end_step(now))
    return now, results


def req(rid: str, tokens: list[int], out: int = 1, at: float = 0.0) -> EngineRequest:
    return EngineRequest(rid, tokens, out, arrival_s=at)


def hits_after(block_size: int, first: int, *later: int) -> list[int]:
    """Cached tokens of requests of ``later`` tokens each, submitted together once a first
    request of ``first`` tokens has finished; every prompt is the token ids 0, 1, 2, ..."""
    m = ReplicaModel(ReplicaConfig(block_size=block_size))
    m.submit(req("first", list(range(first))))
    now, _ = drive(m)
    requests = [req(f"later{i}", list(range(n)), at=now) for i, n in enumerate(later)]
    for r in requests:
        m.submit(r)
    drive(m, now)
    return [r.cached_tokens for r in requests]


def test_prefill_time_is_tokens_over_rate() -> None:
    m = ReplicaModel(ReplicaConfig(block_size=1, prefill_tokens_per_s=10_000))
    r = req("a", list(range(400)))
    m.submit(r)
    drive(m)
    assert r.first_token_s == pytest.approx(0.04)
    assert r.cached_tokens == 0


def test_second_request_reuses_prefix_but_recomputes_last_token() -> None:
    again, longer = hits_after(1, 400, 400, 700)
    assert again == 399  # engines always compute the last prompt token
    assert longer == 400


def test_block_granular_hits_round_down() -> None:
    assert hits_after(16, 700, 1000) == [688]  # 43 full blocks of 16 out of 700 tokens


def test_chunked_prefill_spreads_over_steps_and_decodes_share_them() -> None:
    cfg = ReplicaConfig(block_size=16, step_tokens=256, decode_step_s=0.01)
    m = ReplicaModel(cfg)
    short = req("s", list(range(10)), out=5)
    long = req("l", list(range(1000, 1600)), out=1)
    m.submit(short)
    m.submit(long)
    _, results = drive(m)
    assert long.first_token_s is not None and short.first_token_s is not None
    # 610 prompt tokens need three 256-token steps; the decode of "s" rides along.
    assert len([r for r in results if long in r.first_tokens]) == 1
    assert long.first_token_s > 600 / cfg.prefill_tokens_per_s
    assert short.generated == 5 and long.generated == 1


def test_lru_eviction_under_pressure() -> None:
    m = ReplicaModel(ReplicaConfig(block_size=1, kv_capacity_blocks=1000))
    now = 0.0
    for i in range(3):
        m.submit(req(f"r{i}", list(range(i * 1000, i * 1000 + 600)), at=now))
        now, _ = drive(m, now)
    assert m.cache.evictions > 0
    back = req("back", list(range(600)), at=now)
    m.submit(back)
    drive(m, now)
    assert back.cached_tokens == 0  # the first prompt was evicted by the later ones


def test_fifo_head_waits_for_blocks() -> None:
    m = ReplicaModel(ReplicaConfig(block_size=1, kv_capacity_blocks=100, decode_step_s=0.01))
    first = req("a", list(range(60)), out=20)
    second = req("b", list(range(100, 160)), out=1)
    m.submit(first)
    m.submit(second)
    drive(m)
    assert second.start_s is not None and first.finish_s is not None
    assert second.start_s >= first.finish_s  # did not fit until the first one released


def test_bad_requests_are_refused() -> None:
    m = ReplicaModel(ReplicaConfig(block_size=1, kv_capacity_blocks=10))
    with pytest.raises(RequestTooLarge):
        m.submit(req("big", list(range(20))))
    with pytest.raises(ConfigError):
        m.submit(req("empty", []))
    with pytest.raises(ConfigError):
        ReplicaConfig(kv_capacity_blocks=0)


def test_abort_releases_blocks() -> None:
    m = ReplicaModel(ReplicaConfig(block_size=1, kv_capacity_blocks=200))
    m.submit(req("a", list(range(50)), out=100))
    m.begin_step(0.0)
    m.end_step(0.01)
    assert m.cache.used > 0
    assert m.abort("a")
    assert m.cache.used == 0
    assert not m.abort("a")


def test_recorded_stored_blocks_carry_parent_and_tokens() -> None:
    """What an engine's BlockStored event needs: hash, parent hash and the block's tokens."""
    m = ReplicaModel(ReplicaConfig(block_size=4, step_tokens=8), record_events=True)
    tokens = list(range(100, 118))  # 4 full blocks and a tail, prefilled over three steps
    m.submit(req("a", tokens))
    drive(m)
    stored = m.take_stored_blocks()
    hashes = m.hasher.hash_tokens(tokens)
    assert [b.block_hash for b in stored] == hashes
    assert [b.parent for b in stored] == [None, *hashes[:-1]]
    assert [b.tokens for b in stored] == [tokens[i : i + 4] for i in range(0, 16, 4)]
    assert m.take_stored_blocks() == []
    m.submit(req("b", tokens))  # a full hit: nothing new is stored
    drive(m)
    assert m.take_stored_blocks() == []


def test_stored_blocks_need_record_events_and_reset_clears_the_cache() -> None:
    m = ReplicaModel(ReplicaConfig(block_size=2))
    with pytest.raises(ConfigError):
        m.take_stored_blocks()
    m.submit(req("a", list(range(10))))
    drive(m)
    assert m.cache.cached_blocks == 5
    assert m.reset_prefix_cache()
    assert m.cache.cached_blocks == 0 and m.cache.free == m.cache.capacity
    m.submit(req("b", list(range(10))))
    m.begin_step(0.0)  # b is running: a reset is refused, as vLLM refuses it
    assert not m.reset_prefix_cache()


# --- queue, budget and batch (the module docstring's engine rules) -----------------------------


def _durations(m: ReplicaModel, now: float = 0.0) -> tuple[float, list[float]]:
    """Step ``m`` until it has no work (at most 1,000 steps); the end time and the durations."""
    durations: list[float] = []
    while m.has_work():
        assert len(durations) < 1000, "the replica stopped making progress"
        d = m.begin_step(now)
        durations.append(d)
        now += d
        m.end_step(now)
    return now, durations


MS = ReplicaConfig(block_size=1, prefill_tokens_per_s=1000.0, decode_step_s=0.01)  # 1 token: 1 ms


def test_abort_takes_a_waiting_request_out_of_the_queue() -> None:
    m = ReplicaModel(MS)
    m.submit(req("a", [1, 2]))
    m.submit(req("b", [3, 4]))
    assert m.abort("b") is True
    assert [r.request_id for r in m.waiting] == ["a"]


def test_abort_of_a_request_still_in_prefill_frees_it_for_good() -> None:
    m = ReplicaModel(ReplicaConfig(block_size=1, step_tokens=4, prefill_tokens_per_s=1000.0))
    m.submit(req("a", list(range(10))))
    m.begin_step(0.0)
    m.end_step(0.004)  # 4 of 10 prompt tokens done
    assert m.abort("a") is True
    assert not m.has_work() and m.cache.used == 0
    b = req("b", list(range(100, 104)), at=0.004)
    m.submit(b)
    _, durations = _durations(m, 0.004)
    assert durations == pytest.approx([0.004])  # only b's 4 tokens: a is not planned again


def test_the_budget_left_by_the_request_in_prefill_goes_to_the_next_in_the_queue() -> None:
    # Budget 10 tokens: a's 13 tokens take 10, then its last 3 and 7 of b's; then b's 10 and 3.
    m = ReplicaModel(ReplicaConfig(block_size=1, step_tokens=10, prefill_tokens_per_s=1000.0))
    a, b = req("a", list(range(13))), req("b", list(range(100, 120)))
    m.submit(a)
    m.submit(b)
    _, durations = _durations(m)
    assert durations == pytest.approx([0.010, 0.010, 0.010, 0.003])
    assert a.first_token_s == pytest.approx(0.020) and b.first_token_s == pytest.approx(0.033)
    assert b.start_s == pytest.approx(0.010)


def test_a_budget_of_one_token_beside_the_decodes_still_prefills_one_token_a_step() -> None:
    # Budget 3 with two requests decoding: each step has one token left for the prompt.
    cfg = ReplicaConfig(
        block_size=1, step_tokens=3, prefill_tokens_per_s=1000.0, decode_step_s=0.01
    )
    m = ReplicaModel(cfg)
    m.submit(req("d0", [100], 50))
    m.submit(req("d1", [200], 50))
    m.end_step(m.begin_step(0.0))  # their 1-token prompts: 2 ms; both decode from now on
    p = req("p", [1, 2, 3, 4], at=0.002)
    m.submit(p)
    now, durations = 0.002, []
    while p.first_token_s is None and len(durations) < 100:
        d = m.begin_step(now)
        durations.append(d)
        now += d
        m.end_step(now)
    assert durations == pytest.approx([0.011] * 4)  # 1 prompt token + a decode step, 4 times


def test_several_prompts_share_one_step_budget_in_admission_order() -> None:
    m = ReplicaModel(ReplicaConfig(block_size=1, step_tokens=10, prefill_tokens_per_s=1000.0))
    reqs = [req("a", [1, 2, 3]), req("b", [4, 5, 6]), req("c", list(range(100, 110)))]
    for r in reqs:
        m.submit(r)
    _, durations = _durations(m)
    assert durations == pytest.approx([0.010, 0.006])  # 3 + 3 + 4 tokens, then c's other 6
    assert [r.first_token_s for r in reqs] == pytest.approx([0.010, 0.010, 0.016])


def test_a_request_is_admitted_and_looks_the_cache_up_only_when_the_budget_reaches_it() -> None:
    # Budget 4: a's 8 tokens fill two steps, so b is admitted in the third, after a's blocks
    # were computed: b finds its first 4 tokens cached (admission, not arrival, looks up).
    m = ReplicaModel(ReplicaConfig(block_size=1, step_tokens=4, prefill_tokens_per_s=1000.0))
    a, b = req("a", list(range(8))), req("b", [0, 1, 2, 3, 100])
    m.submit(a)
    m.submit(b)
    _durations(m)
    assert b.start_s == pytest.approx(0.008)
    assert b.cached_tokens == 4


def test_the_running_batch_holds_at_most_max_running_requests() -> None:
    m = ReplicaModel(ReplicaConfig(block_size=1, max_running=1, decode_step_s=0.01))
    a, b = req("a", [1, 2], 3), req("b", [3, 4])
    m.submit(a)
    m.submit(b)
    _durations(m)
    assert b.start_s is not None and a.finish_s is not None
    assert b.start_s >= a.finish_s
