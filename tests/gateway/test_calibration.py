"""The gateway teaches the router each replica's real speed, and reports what it learned.

Two emulated replicas, one prefilling 4x faster than the other (issue 11's heterogeneous
fleet), behind a gateway: streamed requests give measured first tokens, their ``usage`` gives
the tokens really computed, and the learned rates appear in ``/metrics`` and the admin API.
The same usage teaches each model's characters per token (approximate mode's unit).
"""

from __future__ import annotations

import random
import re

import aiohttp

from prefixroute.core import TokenCountConfig, TokenCounts
from prefixroute.core.prompt_key import chat_text
from prefixroute.emulate import EmulatorConfig, start_replicas
from prefixroute.sim.fleet import parse_fleet
from prefixroute.sim.replica import ReplicaConfig

from .helpers import STEADY, ClusterFactory, GatewayFactory, send, words
from .test_precise import metric

ENGINE = ReplicaConfig(block_size=16)
TIME_SCALE = 0.5  # wall seconds per model second: the gateway sees twice the model's rates
TOKEN = "admin-token-for-tests"


def _gauge(metrics: str, name: str, replica: str) -> float:
    match = re.search(rf'^{name}{{replica="{re.escape(replica)}"}} (\S+)$', metrics, re.M)
    assert match is not None, f"{name} for {replica} is not in /metrics"
    return float(match.group(1))


async def test_learned_prefill_rates_follow_the_replicas_true_speeds(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    fleet = parse_fleet("1:prefill=20000+1:prefill=5000", ENGINE)
    cluster = await start_replicas(2, EmulatorConfig(ENGINE, time_scale=TIME_SCALE), fleet)
    try:
        fast, slow = cluster.urls
        gw = await make_gateway(
            cluster.urls, policy="round_robin", admin_token=TOKEN, **STEADY
        )
        for i in range(24):  # distinct prompts (nothing cached), one at a time
            body = {"prompt": f"q{i} " + words(1500), "max_tokens": 2, "stream": True}
            reply = await send(session, gw.url, "/v1/completions", body)
            assert reply.complete, reply
        assert gw.router.usage_reports == 24  # every answer's usage reached the router

        metrics = await (await session.get(gw.url + "/metrics")).text()
        name = "prefixroute_replica_prefill_tokens_per_second"
        rate_fast, rate_slow = _gauge(metrics, name, fast), _gauge(metrics, name, slow)
        # True wall-clock rates: 40,000 and 10,000 tokens/s. Learned from 12 requests each,
        # on a shared machine: the ratio within a factor 1.6 of 4, each rate within 40%.
        assert 2.5 < rate_fast / rate_slow < 6.4, (rate_fast, rate_slow)
        assert abs(rate_fast / 40_000 - 1) < 0.4, rate_fast
        assert abs(rate_slow / 10_000 - 1) < 0.4, rate_slow

        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with session.get(gw.admin_url + "/admin/replicas", headers=headers) as resp:
            listed = {r["url"]: r["speed"] for r in (await resp.json())["replicas"]}
        assert listed[fast]["prefill_tokens_per_s"] == rate_fast
        assert listed[fast]["prior_prefill_tokens_per_s"] == 10_000.0
        assert listed[slow]["prefill_observations"] >= 8
    finally:
        await cluster.stop()


# Prose for the chat workload: words of mixed lengths, as a conversation's text would have.
PROSE = [
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on", "be",
    "by", "at", "this", "from", "or", "an", "are", "not", "have", "which", "one", "all", "their",
    "there", "been", "has", "more", "when", "will", "would", "who", "its", "than", "other",
    "into", "cache", "prefix", "replica", "request", "routing", "latency", "throughput",
    "tokenizer", "conversation", "prediction", "gateway", "calibration", "measurement",
    "distribution", "performance",
]  # fmt: skip


async def _chat_rounds(
    session: aiohttp.ClientSession, url: str, users: int, turns: int
) -> list[tuple[float, int]]:
    """``users`` conversations of ``turns`` turns behind one long system prompt, one request
    at a time; each request's (routing characters / the replica's prompt tokens, tokens)."""
    rng = random.Random(7)

    def prose(n: int) -> str:
        return " ".join(rng.choice(PROSE) for _ in range(n)) + "."

    system = {"role": "system", "content": prose(150)}
    convs: list[list[dict[str, str]]] = [[system] for _ in range(users)]
    ratios = []
    for _ in range(turns):
        for u in range(users):
            messages = [*convs[u], {"role": "user", "content": prose(rng.randint(20, 120))}]
            body = {"model": "emulated", "messages": messages, "max_tokens": 8}
            reply = await send(session, url, "/v1/chat/completions", body)
            assert reply.complete, reply
            tokens = reply.usage["prompt_tokens"] if reply.usage else 0
            ratios.append((len(chat_text(messages)) / tokens, tokens))
            convs[u] = [*messages, {"role": "assistant", "content": reply.text}]
    return ratios


async def test_characters_per_token_are_learned_and_predictions_stop_overshooting(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """Issue 11: at a fixed 4 characters a token, a fresh gateway predicted more cached tokens
    than the replica reported for nearly every request (32 of 36). The emulated tokenizer makes
    one token per word or punctuation mark (measured here: about 4.9 characters of routing text
    a token on this chat, template included), so the same 36 requests (12 users x 3 turns)
    run twice on fresh replicas: with the fixed prior, then learning from usage."""
    engine = ReplicaConfig(block_size=16)
    outcomes = {}
    for learn in (False, True):
        cluster = await make_cluster(4, EmulatorConfig(engine, time_scale=0.01))
        gw = await make_gateway(cluster.urls, **STEADY)
        if not learn:
            gw.router.tokens = TokenCounts(TokenCountConfig(learn=False))
        ratios = await _chat_rounds(session, gw.url, users=12, turns=3)
        text = await (await session.get(gw.url + "/metrics")).text()
        over = metric(text, "prefixroute_cache_predictions_total", outcome="over")
        predicted = metric(text, "prefixroute_predicted_cached_tokens_total")
        actual = metric(text, "prefixroute_actual_cached_tokens_total")
        outcomes[learn] = (over, predicted / actual)
        if learn:
            true = sum(c * t for c, t in ratios) / sum(t for _, t in ratios)  # all characters
            learned = metric(text, "prefixroute_chars_per_token", model="emulated")
            assert abs(learned / true - 1) < 0.15, (learned, true)
            assert abs(learned / 4.0 - 1) > 0.15  # the ratio really differs from the prior
        else:
            assert "prefixroute_chars_per_token{" not in text
    (over_fixed, bias_fixed), (over_learned, bias_learned) = outcomes[False], outcomes[True]
    assert over_fixed >= 30, outcomes  # the issue, reproduced: nearly all over
    assert over_learned <= 0.7 * over_fixed, outcomes
    assert bias_fixed > 1.1 and abs(bias_learned - 1) < 0.1, outcomes  # cached tokens, in total


async def test_each_first_token_is_predicted_then_judged_and_reported(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """Issue 11: the router's predicted TTFT against the measured one, per request. The two
    replicas of the first test (40,000 and 10,000 tokens/s of wall time), prompts of 200 to
    3,000 words, one at a time: past each replica's warm-up (its first 8 observations, the
    priors), the median of ``|predicted / measured - 1|`` is in /metrics and the admin API, and
    within issue 11's 30%."""
    fleet = parse_fleet("1:prefill=20000+1:prefill=5000", ENGINE)
    cluster = await start_replicas(2, EmulatorConfig(ENGINE, time_scale=TIME_SCALE), fleet)
    try:
        gw = await make_gateway(cluster.urls, policy="round_robin", admin_token=TOKEN, **STEADY)
        rng = random.Random(3)
        for i in range(32):
            body = {"prompt": f"p{i} " + words(rng.randint(200, 3000)), "max_tokens": 2}
            reply = await send(session, gw.url, "/v1/completions", {**body, "stream": True})
            assert reply.complete, reply
        metrics = await (await session.get(gw.url + "/metrics")).text()
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with session.get(gw.admin_url + "/admin/replicas", headers=headers) as resp:
            listed = {r["url"]: r["speed"] for r in (await resp.json())["replicas"]}
        pooled = []
        for url in cluster.urls:
            speed = gw.router.replica_load(gw.registry.find(url).id).speed
            pooled += speed.ttft_ratios()
            assert speed.ttft_predictions >= 4, url  # 16 requests, 8 of them past the warm-up
            error = _gauge(metrics, "prefixroute_replica_ttft_prediction_error", url)
            assert error == listed[url]["ttft_error_p50"] == speed.snapshot()["ttft_error_p50"]
        p50 = sorted(abs(r - 1) for r in pooled)[len(pooled) // 2]
        assert p50 <= 0.3, (p50, pooled)  # measured here: 0.005-0.042
    finally:
        await cluster.stop()


async def test_attention_is_learned_unless_the_setting_turns_it_off(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """``learn_attention`` (docs/configuration.md): on by default, a replica whose prompt
    tokens cost more behind a longer context is learned an attention term; off, each replica's
    cost stays linear in its tokens (attention 0 in the admin API's speed)."""
    # 10,000 tokens/s, not 20,000: twice the time per prompt against the same scheduling noise.
    # At 20,000 the learned doubling context ran 209-4,009 while mutation tests shared the VM
    # (out of range in 3 of 31 runs, and once in a CI run); at 10,000, 1,143-1,521 beside them.
    fleet = parse_fleet("2:prefill=10000,attention=1000", ENGINE)
    cluster = await start_replicas(2, EmulatorConfig(ENGINE, time_scale=TIME_SCALE), fleet)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    rng = random.Random(0)
    try:
        learned = {}
        for learn in (True, False):
            gw = await make_gateway(
                cluster.urls, policy="round_robin", admin_token=TOKEN, learn_attention=learn,
                **STEADY,
            )  # fmt: skip
            # Distinct prompts of 100-3,000 words, one at a time: 24 per replica. With 12, the
            # learned doubling context ran 1,450-2,660 on a loaded VM (6,417 once in CI); with
            # 24, 760-2,090 (true: 1,000).
            for i in range(48):
                body = {"prompt": f"{learn} q{i} " + words(rng.randrange(100, 3000)),
                        "max_tokens": 2, "stream": True}  # fmt: skip
                assert (await send(session, gw.url, "/v1/completions", body)).complete
            async with session.get(gw.admin_url + "/admin/replicas", headers=headers) as resp:
                speeds = [r["speed"] for r in (await resp.json())["replicas"]]
            assert all(s["prefill_observations"] >= 8 for s in speeds), speeds
            learned[learn] = [s["attention_tokens"] for s in speeds]
        # True: a token costs double behind 1,000 tokens. Learned within a factor 3 on a
        # shared machine; off, none (no doubling context: None).
        assert all(a is not None and 333 < a < 3000 for a in learned[True]), learned
        assert learned[False] == [None, None], learned
    finally:
        await cluster.stop()
