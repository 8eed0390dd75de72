"""The replica model's step budget, exactly (sim/replica.py's docstring, docs/mutation.md):
"each step has a token budget: one token per decoding request, the rest for prefill chunks";
"step time = prefill tokens / prefill rate, plus decode_step_s when any request decodes"."""

from __future__ import annotations

import pytest

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
        (
            "prefill_tokens_per_s",
            0.0,
            0.5,
            "prefill rate must be positive and decode step time non-negative",
        ),
        (
            "decode_step_s",
            -0.001,
            0.0,
            "prefill rate must be positive and decode step time non-negative",
        ),
    ],
)
def test_replica_config_bounds(field: str, bad: float, good: float, message: str) -> None:
    from prefixroute.core import ConfigError

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
