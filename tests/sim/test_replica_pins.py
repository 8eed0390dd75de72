"""The replica model's step budget, exactly (sim/replica.py's docstring, docs/mutation.md):
"each step has a token budget: one token per decoding request, the rest for prefill chunks";
"step time = prefill tokens / prefill rate, plus decode_step_s when any request decodes"."""

from __future__ import annotations

import math

import pytest

from prefixroute.core import BlockHasher, ConfigError, RequestTooLarge
from prefixroute.sim.replica import EngineRequest, ReplicaConfig, ReplicaModel


@pytest.mark.parametrize("decoding", [1, 3])
def test_decodes_take_one_token_each_of_the_step_budget(decoding: int) -> None:
    # Budget 10 tokens; ``decoding`` requests generating throughout; then a 20-token prompt.
    # Its chunks are (10 - decoding) tokens per step, each step also paying one decode step.
    cfg = ReplicaConfig(
        block_size=1, step_tokens=10, prefill_tokens_per_s=1000.0, decode_step_s=0.01
    )
    m = ReplicaModel(cfg)
    now = 0.0
    for i in range(decoding):
        m.submit(EngineRequest(f"d{i}", [100 * (i + 1)], 1000, arrival_s=0.0))
    while any(r.first_token_s is None for r in m.running) or m.waiting:  # all decoding now
        d = m.begin_step(now)
        now += d
        m.end_step(now)
    start = now
    prompt = EngineRequest("p", list(range(1000, 1020)), 1, arrival_s=start)
    m.submit(prompt)
    durations = []
    while prompt.first_token_s is None:
        d = m.begin_step(now)
        durations.append(d)
        now += d
        m.end_step(now)
    per_step = 10 - decoding
    chunks = [per_step] * (20 // per_step) + ([20 % per_step] if 20 % per_step else [])
    assert durations == pytest.approx([c / 1000.0 + 0.01 for c in chunks])
    assert prompt.first_token_s == pytest.approx(start + sum(durations))


SPEEDS = (
    "prefill rate must be positive and decode step time non-negative, both finite: got {} and {}"
)


@pytest.mark.parametrize(
    ("field", "bad", "good", "message"),
    [
        (
            "kv_capacity_blocks",
            0,
            1,
            "replica sizes (capacity, block size, budget, batch) must be >= 1",
        ),
        ("block_size", 0, 1, "replica sizes (capacity, block size, budget, batch) must be >= 1"),
        ("step_tokens", 0, 1, "replica sizes (capacity, block size, budget, batch) must be >= 1"),
        ("max_running", 0, 1, "replica sizes (capacity, block size, budget, batch) must be >= 1"),
        ("prefill_tokens_per_s", 0.0, 0.5, SPEEDS.format(0.0, 0.015)),
        ("prefill_tokens_per_s", math.inf, 1e12, SPEEDS.format(math.inf, 0.015)),
        ("prefill_tokens_per_s", math.nan, 0.5, SPEEDS.format(math.nan, 0.015)),
        ("decode_step_s", -0.001, 0.0, SPEEDS.format(10_000.0, -0.001)),
        ("decode_step_s", math.inf, 1e6, SPEEDS.format(10_000.0, math.inf)),
        ("decode_step_s", math.nan, 0.0, SPEEDS.format(10_000.0, math.nan)),
    ],
)
def test_replica_config_bounds(field: str, bad: float, good: float, message: str) -> None:
    ReplicaConfig(**{field: good})  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as info:
        ReplicaConfig(**{field: bad})  # type: ignore[arg-type]
    assert str(info.value) == message


def _serve(requests: list[EngineRequest], fast_forward: bool) -> tuple[list[float], float]:
    """Drive one replica through ``requests`` (sorted by arrival) as the cluster does: a request
    arriving during a planned step is submitted at once and interrupts a fast-forwarded one."""
    cfg = ReplicaConfig(
        block_size=4, step_tokens=64, prefill_tokens_per_s=2000.0, decode_step_s=0.01
    )
    m = ReplicaModel(cfg, fast_forward=fast_forward, report_decodes=not fast_forward)
    pending = list(requests)
    now, end = 0.0, None
    while pending or m.has_work():
        if end is None and not m.has_work():
            now = pending[0].arrival_s
            m.submit(pending.pop(0))
            continue
        if end is None:
            end = now + m.begin_step(now)
        if pending and pending[0].arrival_s < end:
            now = pending[0].arrival_s
            m.submit(pending.pop(0))
            new_end = m.interrupt(now)
            if new_end is not None:
                end = new_end
            continue
        now, end = end, None
        m.end_step(now)
    out = []
    for r in requests:
        assert r.first_token_s is not None and r.finish_s is not None
        out += [r.first_token_s, r.finish_s]
    return out, m.busy_s


@pytest.mark.parametrize("seed", range(4))
def test_fast_forward_gives_the_same_times_as_stepping_one_by_one(seed: int) -> None:
    # sim/replica.py: "so the result equals stepping one by one, at a fraction of the events".
    # Short prompts and long outputs: mostly decode-only stretches, cut by arrivals at every
    # offset into them.
    import random

    def workload() -> list[EngineRequest]:
        rng = random.Random(seed)
        reqs, at = [], 0.0
        for i in range(30):
            at += rng.choice([0.001, 0.004, 0.0101, 0.02, 0.035, 0.1, 0.3])
            prompt = list(range(1000 * i, 1000 * i + rng.randint(1, 90)))
            reqs.append(EngineRequest(f"r{i}", prompt, rng.randint(1, 60), arrival_s=at))
        return reqs

    stepped, busy_stepped = _serve(workload(), fast_forward=False)
    forwarded, busy_forwarded = _serve(workload(), fast_forward=True)
    assert forwarded == pytest.approx(stepped, abs=1e-9)
    assert busy_forwarded == pytest.approx(busy_stepped, abs=1e-9)
    assert len(set(stepped[1::2])) > 20  # the requests finish at many different times


# --- the rest of the model, rule by rule (sim/replica.py's docstrings) -------------------------

MS = ReplicaConfig(block_size=1, prefill_tokens_per_s=1000.0, decode_step_s=0.01)  # 1 token: 1 ms


def _drive(m: ReplicaModel, now: float = 0.0, max_steps: int = 10_000) -> tuple[float, list[float]]:
    """Step ``m`` until it has no work (at most ``max_steps``); the end time and the durations."""
    durations: list[float] = []
    while m.has_work():
        assert len(durations) < max_steps, "the replica stopped making progress"
        d = m.begin_step(now)
        durations.append(d)
        now += d
        m.end_step(now)
    return now, durations


def _req(rid: str, tokens: list[int], out: int = 1, at: float = 0.0) -> EngineRequest:
    return EngineRequest(rid, tokens, out, arrival_s=at)


@pytest.mark.parametrize("out", [1, 2, 4])
def test_by_default_each_step_decodes_one_token_and_reports_every_decode(out: int) -> None:
    # Defaults: no fast_forward (one step per decoded token), report_decodes on ("list every
    # decoding request in each StepResult", ``generated`` kept current). A 4-token prompt takes
    # 4 ms and gives the first token; each further token is one 10 ms decode step.
    m = ReplicaModel(MS)
    r = _req("a", [1, 2, 3, 4], out)
    m.submit(r)
    now, durations, decoded, generated = 0.0, [], [], []
    while m.has_work():
        d = m.begin_step(now)
        durations.append(d)
        now += d
        result = m.end_step(now)
        decoded.append([q.request_id for q in result.decoded])
        generated.append(r.generated)
    assert durations == pytest.approx([0.004] + [0.01] * (out - 1))
    assert decoded == [[]] + [["a"]] * (out - 1)
    assert generated == list(range(1, out + 1))
    assert r.first_token_s == pytest.approx(0.004)
    assert r.finish_s == pytest.approx(0.004 + 0.01 * (out - 1))


def test_with_fast_forward_a_decode_stretch_is_one_step_until_the_next_finish() -> None:
    m = ReplicaModel(MS, fast_forward=True)
    r = _req("a", [1, 2, 3, 4], 4)
    m.submit(r)
    assert _drive(m)[1] == pytest.approx([0.004, 0.03])  # three decodes planned as one step
    assert r.finish_s == pytest.approx(0.034)


def test_blocks_are_hashed_as_the_router_hashes_them_with_the_replica_seed() -> None:
    # The engine's block hashes are what its KV events report, so they must be the router's
    # (BlockHasher, whose default seed is 0; ``hash_seed`` gives another).
    tokens = list(range(40))
    hashes = {}
    for seed, m in ((0, ReplicaModel(ReplicaConfig(block_size=4))),
                    (7, ReplicaModel(ReplicaConfig(block_size=4), hash_seed=7))):  # fmt: skip
        r = _req("a", tokens)
        m.submit(r)
        assert r.block_hashes == BlockHasher(4, seed).hash_tokens(tokens)
        hashes[seed] = r.block_hashes
    assert hashes[0] != hashes[7]


def test_cache_events_are_the_blocks_stored_and_evicted_since_the_last_call() -> None:
    # record_events: take_cache_events gives the hashes made reusable and those evicted since the
    # last call. Eviction takes free blocks first, then the least recently used idle ones, and a
    # request's blocks go back tail first, so its last block is evicted first (sim/kv_cache.py).
    m = ReplicaModel(ReplicaConfig(block_size=2, kv_capacity_blocks=4), record_events=True)
    a = [1, 2, 3, 4]  # 2 full blocks, plus 1 block for its output: 3 of 4
    m.submit(_req("a", a))
    now, _ = _drive(m)
    ha = m.hasher.hash_tokens(a)
    assert m.take_cache_events() == (ha, [])
    assert m.take_cache_events() == ([], [])
    b = [5, 6, 7, 8]  # 3 blocks: the 2 free ones and a's last block, evicted
    m.submit(_req("b", b, at=now))
    _drive(m, now)
    assert m.take_cache_events() == (m.hasher.hash_tokens(b), [ha[1]])
    # Without record_events nothing is kept.
    quiet = ReplicaModel(ReplicaConfig(block_size=2))
    quiet.submit(_req("a", a))
    _drive(quiet)
    assert quiet.take_cache_events() == ([], [])


def test_totals_count_every_request_since_creation() -> None:
    # prefill_tokens (computed), cached_tokens (reused), busy_s (time in steps), completed.
    m = ReplicaModel(MS)
    assert (m.prefill_tokens, m.cached_tokens, m.busy_s, m.completed) == (0, 0, 0.0, 0)
    prompt = list(range(10))
    m.submit(_req("a", prompt, 3))  # 10 computed; 10 ms prefill + 2 decode steps of 10 ms
    now, _ = _drive(m)
    m.submit(_req("b", prompt + [50, 51, 52, 53, 54], at=now))  # 10 cached, 5 computed: 5 ms
    now, _ = _drive(m, now)
    m.submit(_req("c", prompt, at=now))  # 9 cached (the last is computed), 1 computed: 1 ms
    _drive(m, now)
    assert m.prefill_tokens == 16
    assert m.cached_tokens == 19
    assert m.busy_s == pytest.approx(0.036)
    assert m.completed == 3


def test_the_last_prompt_token_is_computed_even_for_a_one_token_prompt() -> None:
    m = ReplicaModel(MS)
    m.submit(_req("a", [5]))
    now, _ = _drive(m)
    again = _req("b", [5], at=now)
    m.submit(again)
    _drive(m, now)
    assert again.cached_tokens == 0  # the hit is capped at prompt - 1 = 0 tokens


def test_a_request_whose_blocks_exactly_fill_the_cache_is_served() -> None:
    m = ReplicaModel(ReplicaConfig(block_size=1, kv_capacity_blocks=10))
    r = _req("fits", list(range(9)))  # 9 prompt + 1 output token: 10 blocks
    m.submit(r)
    _drive(m)
    assert r.finish_s is not None
    with pytest.raises(RequestTooLarge) as info:
        m.submit(_req("big", list(range(10))))
    assert str(info.value) == "request big needs 11 KV blocks; the replica has 10"


@pytest.mark.parametrize(("tokens", "out"), [([], 1), ([1], 0)])
def test_a_request_needs_a_prompt_token_and_an_output_token(tokens: list[int], out: int) -> None:
    with pytest.raises(ConfigError) as info:
        ReplicaModel().submit(_req("r", tokens, out))
    assert str(info.value) == "a request needs at least one prompt token and one output token"


def test_a_hit_plus_the_free_blocks_that_exactly_fit_is_admitted() -> None:
    # Capacity 10: a's 6 prompt blocks stay cached (idle); b reuses them and needs 4 more of the
    # 4 free ones (its hit blocks are not evictable room for itself).
    m = ReplicaModel(ReplicaConfig(block_size=1, kv_capacity_blocks=10))
    m.submit(_req("a", list(range(6))))
    now, _ = _drive(m)
    b = _req("b", [*range(6), 6, 7, 8], at=now)  # 9 prompt + 1 output: 10 blocks, 6 cached
    m.submit(b)
    _drive(m, now, max_steps=100)
    assert b.finish_s is not None and b.cached_tokens == 6


def test_a_head_whose_blocks_do_not_fit_waits_without_evicting_its_own_hit() -> None:
    # Capacity 12: a's 6 prompt blocks are cached; d (4 blocks) runs; b needs 10 blocks, 6 of
    # them a's: the 4 others do not fit beside d (2 free), so b waits for d, keeping its hit.
    m = ReplicaModel(ReplicaConfig(block_size=1, kv_capacity_blocks=12, decode_step_s=0.01))
    m.submit(_req("a", list(range(6))))
    now, _ = _drive(m)
    d = _req("d", [50], 3, at=now)  # 1 prompt + 3 output: 4 blocks
    b = _req("b", [*range(6), 6, 7, 8], at=now)
    m.submit(d)
    m.submit(b)
    _drive(m, now, max_steps=100)
    assert b.start_s is not None and d.finish_s is not None
    assert b.start_s >= d.finish_s
    assert b.cached_tokens == 6


def test_set_speed_applies_from_the_next_step_and_none_keeps_a_speed() -> None:
    m = ReplicaModel(MS)
    m.submit(_req("a", list(range(10)), 3))
    d1 = m.begin_step(0.0)  # 10 tokens at 1000/s
    m.set_speed(prefill_tokens_per_s=500.0)  # during the step: it keeps its duration
    m.end_step(d1)
    assert d1 == pytest.approx(0.010) and m.busy_s == pytest.approx(0.010)
    d2 = m.begin_step(d1)  # a decodes: the decode step time was left unchanged
    m.end_step(d1 + d2)
    m.set_speed(decode_step_s=0.02)  # the prefill rate stays at 500/s
    m.submit(_req("b", list(range(100, 110)), at=d1 + d2))
    d3 = m.begin_step(d1 + d2)  # b's 10 tokens at 500/s, and a's last decode at 0.02 s
    assert (d2, d3) == pytest.approx((0.01, 0.04))
    assert m.config == ReplicaConfig(block_size=1, prefill_tokens_per_s=500.0, decode_step_s=0.02)


def _stretch() -> ReplicaModel:
    """A replica in a fast-forwarded decode stretch from 0.25 s to 1.0 s: three steps of 0.25 s
    (binary fractions: the boundaries are exact in floating point)."""
    m = ReplicaModel(
        ReplicaConfig(block_size=1, prefill_tokens_per_s=4.0, decode_step_s=0.25),
        fast_forward=True,
    )
    m.submit(_req("a", [1], 4))
    m.end_step(m.begin_step(0.0))  # the 1-token prompt: 0.25 s, first token
    assert m.begin_step(0.25) == 0.75
    return m


def test_an_arrival_cuts_a_stretch_at_the_next_step_boundary() -> None:
    assert _stretch().interrupt(0.3) == 0.5
    assert _stretch().interrupt(0.75) == 0.75  # exactly on a boundary: the stretch ends there
    assert _stretch().interrupt(0.9) is None  # in its last step: it ends as planned


def test_an_interrupt_with_no_stretch_planned_changes_nothing() -> None:
    # The cluster calls interrupt whenever work arrives for a stepping replica, also between
    # end_step and the next begin_step.
    m = ReplicaModel(MS, fast_forward=True)
    assert m.interrupt(0.0) is None
    m.submit(_req("a", [1, 2], 3))
    m.end_step(m.begin_step(0.0))
    assert m.interrupt(0.002) is None


def test_stored_blocks_name_their_lora_adapter() -> None:
    m = ReplicaModel(ReplicaConfig(block_size=2), record_events=True)
    m.submit(EngineRequest("a", [1, 2, 3, 4], 1, arrival_s=0.0, lora_name="sql"))
    _drive(m)
    assert [b.lora_name for b in m.take_stored_blocks()] == ["sql", "sql"]


def test_a_reset_drops_pending_stored_block_records() -> None:
    m = ReplicaModel(ReplicaConfig(block_size=2), record_events=True)
    m.submit(_req("a", [1, 2, 3, 4]))
    _drive(m)
    assert m.reset_prefix_cache()
    assert m.take_stored_blocks() == []
    quiet = ReplicaModel(ReplicaConfig(block_size=2))
    quiet.submit(_req("a", [1, 2, 3, 4]))
    _drive(quiet)
    assert quiet.reset_prefix_cache()
    with pytest.raises(ConfigError) as info:
        quiet.take_stored_blocks()  # still: only with record_events
    assert str(info.value) == "the replica model records cache events only with record_events"


def _run_to_end(m: ReplicaModel, now: float = 0.0) -> float:
    while m.has_work():
        now += m.begin_step(now)
        m.end_step(now)
    return now


def test_blocks_of_a_request_with_a_hit_all_come_back() -> None:
    # sim/kv_cache.py: a block is free, in use, or cached and idle. A second request hits the
    # first's 2 full blocks and takes 1 more for the rest of its 9 + 1 tokens; when it ends,
    # nothing is in use and every one of the 16 blocks is free or idle again.
    m = ReplicaModel(ReplicaConfig(kv_capacity_blocks=16, block_size=4, step_tokens=64))
    prompt = list(range(9))
    m.submit(EngineRequest("a", prompt, 1, arrival_s=0.0))
    now = _run_to_end(m)
    second = EngineRequest("b", prompt, 1, arrival_s=now)
    m.submit(second)
    m.begin_step(now)
    assert second.cached_tokens == 8
    assert m.cache.used == 3  # 2 hit blocks pinned + 1 taken
    _run_to_end(m, now)
    assert m.cache.used == 0
    assert m.cache.available() == 16
    assert m.cache.cached_blocks == 2


def test_a_block_computed_twice_stays_an_anonymous_duplicate() -> None:
    # kv_cache.register: "False if a copy is already cached: the caller's block then stays an
    # anonymous duplicate, freed on release". Two identical 8-token prompts prefill in the same
    # step: the first caches its 2 full blocks, the second's copies are duplicates.
    m = ReplicaModel(
        ReplicaConfig(kv_capacity_blocks=16, block_size=4, step_tokens=64), record_events=True
    )
    prompt = list(range(8))
    a, b = EngineRequest("a", prompt, 5, arrival_s=0.0), EngineRequest("b", prompt, 8, 0.0)
    m.submit(a)
    m.submit(b)
    now = m.begin_step(0.0)
    m.end_step(now)
    assert a.cached_tokens == b.cached_tokens == 0
    assert m.cache.used == 8  # 4 blocks each: 8 prompt + 5 or 8 output tokens
    assert m.cache.cached_blocks == 2
    assert [s.block_hash for s in m.take_stored_blocks()] == m.hasher.hash_tokens(prompt)
    _run_to_end(m, now)
    assert m.take_stored_blocks() == []
    assert m.cache.used == 0
    assert m.cache.available() == 16
    assert m.cache.cached_blocks == 2
