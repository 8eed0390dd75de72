"""vLLM's preemption in the replica model (``ReplicaConfig.preempt``, sim/preemption.py).

The expected timelines are worked by hand from the rules in sim/replica.py's docstring: blocks
as tokens need them, the newest running request preempted when a decoding one finds none, its
prompt and output so far recomputed when readmitted, and that prefill emitting its next token.
"""

from __future__ import annotations

import pytest

from prefixroute.core import ConfigError
from prefixroute.sim.fleet import parse_fleet
from prefixroute.sim.replica import EngineRequest, ReplicaConfig, ReplicaModel

RATE, STEP = 1000.0, 0.01  # prefill tokens/s, decode step seconds


def two_requests(
    preempt: bool, fast_forward: bool, b_output: int = 12
) -> tuple[ReplicaModel, dict[str, float]]:
    """A 32-token cache (8 blocks of 4) and two requests of 8 prompt and 12 output tokens (b:
    ``b_output``): both prompts fit at once, both outputs do not. Returns the model and each
    finish time; every step's decoded requests are checked to have produced one more token."""
    cfg = ReplicaConfig(
        kv_capacity_blocks=8, block_size=4, prefill_tokens_per_s=RATE, decode_step_s=STEP,
        preempt=preempt,
    )  # fmt: skip
    m = ReplicaModel(cfg, fast_forward=fast_forward)
    m.submit(EngineRequest("a", list(range(8)), 12, 0.0))
    m.submit(EngineRequest("b", list(range(100, 108)), b_output, 0.0))
    now, done, tokens = 0.0, {}, {"a": 0, "b": 0}
    while m.has_work():
        now += m.begin_step(now)
        result = m.end_step(now)
        for r in result.first_tokens + result.decoded:  # a fast-forwarded step: several
            tokens[r.request_id] = r.generated if fast_forward else tokens[r.request_id] + 1
            assert tokens[r.request_id] == r.generated
        for r in result.finished:
            assert r.generated == r.output_tokens
            done[r.request_id] = now
    assert tokens == {"a": 12, "b": b_output}
    return m, done


@pytest.mark.parametrize("fast_forward", [False, True])
def test_the_newest_request_is_preempted_and_recomputes_its_prompt_and_output(
    fast_forward: bool,
) -> None:
    m, done = two_requests(preempt=True, fast_forward=fast_forward)
    # Step 1 prefills both prompts (16 tokens, no decodes yet): both first tokens at 16 ms.
    # Steps 2-9 decode tokens 2-9 of each. Step 10 writes a's 17th token's KV: a needs a 5th
    # block, the cache's 8 are a's 4 and b's 4, so b (the newest) is preempted with 9 tokens.
    # a decodes tokens 10-12 alone (steps 10-12): a ends at 16 ms + 11 steps.
    assert done["a"] == pytest.approx(16 / RATE + 11 * STEP)
    # b comes back once a's blocks are free: its first prompt block is still cached (the hit
    # stops one token short of the prompt's end: a whole block), so it recomputes the other
    # 4 prompt tokens and its 9 output tokens, 13 in one step that emits token 10; then 2 steps.
    assert done["b"] == pytest.approx(done["a"] + 13 / RATE + 2 * STEP)
    assert m.preemptions == 1
    assert m.prefill_tokens == 16 + 13
    assert m.cached_tokens == 4  # the readmission's hit; the first admissions found nothing


def test_a_resumption_that_emits_the_last_token_finishes_the_request() -> None:
    # As above, b preempted with 9 of its 10 tokens: its recomputation emits the 10th, its last.
    m, done = two_requests(preempt=True, fast_forward=False, b_output=10)
    assert done["b"] == pytest.approx(done["a"] + 13 / RATE)
    assert m.completed == 2 and not m.running


def four_token_prompts(names: str) -> tuple[ReplicaModel, list[EngineRequest], list[str]]:
    """4-token prompts (a block each), 9 output tokens each, in a 4-block cache, run to the
    end. Returns the model, the requests and the order of their preemptions."""
    cfg = ReplicaConfig(kv_capacity_blocks=4, block_size=4, prefill_tokens_per_s=RATE,
                        decode_step_s=STEP, preempt=True)  # fmt: skip
    m = ReplicaModel(cfg)
    reqs = [EngineRequest(n, list(range(10 * i, 10 * i + 4)), 9, 0.0) for i, n in enumerate(names)]
    for r in reqs:
        m.submit(r)
    now, order, counts = 0.0, [], [0] * len(reqs)
    while m.has_work():
        now += m.begin_step(now)
        m.end_step(now)
        order += [r.request_id for i, r in enumerate(reqs) if r.preemptions > counts[i]]
        counts = [r.preemptions for r in reqs]
    return m, reqs, order


def test_the_newest_of_three_is_preempted_and_counts_add_up() -> None:
    # At step 2 each writes its 5th token's KV: a takes the free block, b finds none and
    # preempts the newest, c; at step 6 (9 tokens' KV) a needs a third block: b, the newest
    # left, goes.
    m, (a, b, c), order = four_token_prompts("abc")
    assert order[:2] == ["c", "b"]
    assert (a.preemptions, b.preemptions) == (0, 1)
    assert m.preemptions == a.preemptions + b.preemptions + c.preemptions >= 2
    assert m.completed == 3


def test_a_request_can_be_preempted_again() -> None:
    # Four prompts fill the cache. Step 2: a's and b's 5th tokens need blocks: d, then c,
    # preempted (the newest first). At 9 tokens' KV a needs a third block: b goes. Once a is
    # done, b comes back alone (c needs 2 blocks of the 1 left); then c and d, on 2 blocks
    # each, outgrow the 4 and d, the newer, is preempted a second time.
    m, reqs, order = four_token_prompts("abcd")
    assert [r.preemptions for r in reqs] == [0, 1, 1, 2]
    assert sorted(order[:2]) == ["c", "d"] and order[2:] == ["b", "d"]  # (one step: c, d)
    assert m.preemptions == 4 and m.completed == 4


def test_a_preempted_request_keeps_its_first_admission_and_first_token() -> None:
    cfg = ReplicaConfig(kv_capacity_blocks=8, block_size=4, prefill_tokens_per_s=RATE,
                        decode_step_s=STEP, preempt=True)  # fmt: skip
    m = ReplicaModel(cfg)
    a = EngineRequest("a", list(range(8)), 12, 0.0)
    b = EngineRequest("b", list(range(100, 109)), 12, 0.0)
    m.submit(a)
    m.submit(b)
    now, firsts = 0.0, []
    while m.has_work():
        now += m.begin_step(now)
        firsts += [r.request_id for r in m.end_step(now).first_tokens]
    assert firsts == ["a", "b"]  # the resumption's token is no first token
    assert (b.start_s, b.first_token_s) == (0.0, pytest.approx(17 / RATE))
    assert (b.preemptions, a.preemptions) == (1, 0)
    assert b.cached_tokens == 0  # what its first admission found, as vLLM reports it


def test_nothing_is_admitted_in_a_step_that_preempted() -> None:
    # b shares a's 8-token prompt, so its prompt's two blocks stay pinned by a when b is
    # preempted and make its readmission cheap enough to fit at once; vLLM still waits a step.
    cfg = ReplicaConfig(kv_capacity_blocks=8, block_size=4, prefill_tokens_per_s=RATE,
                        decode_step_s=STEP, preempt=True)  # fmt: skip
    m = ReplicaModel(cfg)
    m.submit(EngineRequest("a", list(range(8)), 12, 0.0))
    m.submit(EngineRequest("b", list(range(9)), 12, 0.0))
    now, done = 0.0, {}
    while m.has_work():
        now += m.begin_step(now)
        done |= {r.request_id: now for r in m.end_step(now).finished}
    # Step 1 prefills 17 tokens (b's prompt blocks end up a's duplicates: admitted together,
    # neither found the other's). b (3 blocks, then 4) needs a 5th at step 9: preempted, and
    # step 9 decodes a alone. Step 10 readmits b on a's two blocks: it recomputes its 9th
    # prompt token and 8 outputs (9 tokens) beside a's decode, which emits b's token 9. Each
    # then ends 12 tokens in: a at step 12, b one step later.
    assert done["a"] == pytest.approx(26 / RATE + 11 * STEP)
    assert done["b"] == pytest.approx(26 / RATE + 12 * STEP)
    assert (m.preemptions, m.prefill_tokens, m.cached_tokens) == (1, 26, 8)


def test_without_preempt_outputs_are_reserved_and_the_second_waits() -> None:
    m, done = two_requests(preempt=False, fast_forward=False)
    # a reserves 5 blocks (20 tokens), b cannot get its 5 of the 3 left: b starts after a.
    assert m.preemptions == 0
    assert done["a"] == pytest.approx(8 / RATE + 11 * STEP)
    assert done["b"] > done["a"]


def test_a_request_preempted_before_its_first_token_waits_at_the_queue_head() -> None:
    # One block of cache room past two prompts: the decoding request takes it, then needs one
    # more while the second is still prefilling (a 1-token budget per step keeps it there).
    cfg = ReplicaConfig(kv_capacity_blocks=3, block_size=4, prefill_tokens_per_s=RATE,
                        decode_step_s=STEP, step_tokens=2, preempt=True)  # fmt: skip
    m = ReplicaModel(cfg)
    first, second = EngineRequest("a", [1], 9, 0.0), EngineRequest("b", list(range(5, 13)), 2, 0.0)
    m.submit(first)
    m.submit(second)
    now = 0.0
    while m.has_work():
        now += m.begin_step(now)
        m.end_step(now)
    assert (second.preemptions, first.preemptions) == (1, 0)
    # b had computed 4 of its 8 prompt tokens; its cached block was evicted for a's output by
    # the time it came back, so it computed all 8 again: 1 + 4 + 8 in all.
    assert m.prefill_tokens == 13
    assert first.generated == 9 and second.generated == 2
    assert m.completed == 2


def test_fleet_text_sets_preempt() -> None:
    fleet = parse_fleet("1+1:preempt=1", ReplicaConfig())
    assert [c.preempt for c in fleet.configs] == [False, True]
    with pytest.raises(ConfigError, match="preempt is 0 or 1"):
        parse_fleet("2:preempt=2", ReplicaConfig())


def test_an_aborted_decoding_request_never_finishes() -> None:
    m = ReplicaModel(ReplicaConfig(block_size=4, prefill_tokens_per_s=RATE, decode_step_s=STEP))
    m.submit(EngineRequest("a", list(range(8)), 10, 0.0))
    m.submit(EngineRequest("b", list(range(100, 108)), 10, 0.0))
    now = m.begin_step(0.0)
    assert [r.request_id for r in m.end_step(now).first_tokens] == ["a", "b"]
    assert m.abort("a")
    finished = []
    while m.has_work():
        now += m.begin_step(now)
        finished += [r.request_id for r in m.end_step(now).finished]
    assert finished == ["b"] and m.completed == 1
