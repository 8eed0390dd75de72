from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from prefixroute.core import index_blocks_for
from prefixroute.emulate import EmulatorConfig
from prefixroute.gateway._index_size import MIN_ANSWERS
from prefixroute.gateway._scrape import (
    SETTLED_SPAN,
    EngineLoad,
    PrefillDelta,
    PrefillDeltas,
    PrefillTotals,
    parse_engine_load,
)
from prefixroute.sim.replica import ReplicaConfig

from .fakes import Handler, completion_body
from .helpers import ClusterFactory, FakeFactory, GatewayFactory, send, words

METRICS = Path(__file__).resolve().parents[1] / "data" / "metrics"  # engines' /metrics pages


def exposition(name: str) -> str:
    """A Prometheus text page written with an engine's metric names (tests/data/metrics)."""
    return (METRICS / name).read_text()


VLLM = exposition("vllm_load.prom")
SGLANG = exposition("sglang_load.prom")


def test_vllm_and_sglang_names() -> None:
    assert parse_engine_load(VLLM) == EngineLoad(5, 1, 0.375)
    assert parse_engine_load(SGLANG) == EngineLoad(4, 6, 0.1)
    assert parse_engine_load("other_metric 1\n") == EngineLoad(None, None, None)
    assert parse_engine_load("{{{ not prometheus") == EngineLoad(None, None, None)


def test_preemption_counts_from_vllm_and_sglang_names() -> None:
    vllm = (
        "# TYPE vllm:num_preemptions counter\n"
        'vllm:num_preemptions_total{engine="0",model_name="m"} 3.0\n'
        'vllm:num_preemptions_total{engine="1",model_name="m"} 4.0\n'
    )
    assert parse_engine_load(vllm).preemptions == 7  # data-parallel engines: summed
    sglang = (
        "# TYPE sglang:num_retracted_reqs gauge\nsglang:num_retracted_reqs 9.0\n"
        "# TYPE sglang:num_retracted_requests counter\n"
        "sglang:num_retracted_requests_total 2.0\n"
    )
    assert parse_engine_load(sglang).preemptions == 2  # the counter, not the resetting gauge
    # SGLang writes its counter at the first retraction: none on the page is none so far.
    assert parse_engine_load(SGLANG).preemptions == 0


async def test_health_rounds_feed_the_load_view(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory
) -> None:
    cluster = await make_cluster(1)
    gw = await make_gateway(cluster.urls)
    load = gw.router.loads.get(gw.registry.find(cluster.urls[0]).id)
    async with asyncio.timeout(5):
        while load.kv_usage is None:
            await asyncio.sleep(0.02)
    assert load.num_running == 0 and load.num_waiting == 0


# vLLM 0.32's prefill histograms (names and semantics as vllm/v1/metrics/loggers.py has them),
# over two data-parallel engines.
VLLM_PREFILL = exposition("vllm_prefill.prom")
# An older vLLM: no computed-tokens histogram; prefix-cache queries less hits instead (its prompt
# tokens, counted at the first token, are another number: 4,200 of which 4 requests' time).
VLLM_OLDER = exposition("vllm_older_prefill.prom")
SGLANG_PREFILL = exposition("sglang_prefill.prom")


def test_prefill_totals_from_vllm_and_sglang_names() -> None:
    assert parse_engine_load(VLLM_PREFILL).prefill == PrefillTotals(2.0, 15.0, 12000.0)
    # Counted apart from the times (at scheduling; SGLang's at the end): not aligned.
    assert parse_engine_load(VLLM_OLDER).prefill == PrefillTotals(2.0, 4.0, 4000.0, False)
    assert parse_engine_load(SGLANG_PREFILL).prefill == PrefillTotals(3.0, 6.0, 5000.0, False)
    # Prompt tokens less hits, counted at different moments, are never read as a count.
    no_queries = VLLM_OLDER.replace("vllm:prefix_cache_queries_total", "other_total")
    assert parse_engine_load(no_queries).prefill is None
    for page in (VLLM, SGLANG, "{{{ not prometheus"):  # no prefill times: no totals
        assert parse_engine_load(page).prefill is None


def test_prefill_deltas_between_scrapes() -> None:
    deltas = PrefillDeltas()
    assert deltas.update("r", PrefillTotals(100.0, 50.0, 9e5)) is None  # the baseline
    assert deltas.update("r", PrefillTotals(102.0, 60.0, 9.1e5)) == PrefillDelta(1e4, 10, 2.0)
    assert deltas.update("r", PrefillTotals(102.0, 60.0, 9.1e5)) is None  # nothing finished
    # The engine restarted: its counters began again, and the new totals are the interval's.
    assert deltas.update("r", PrefillTotals(0.5, 3.0, 900.0)) == PrefillDelta(900.0, 3, 0.5)
    # Gone from the page (a replica that stopped exporting): the next page is a new baseline.
    assert deltas.update("r", None) is None
    assert deltas.update("r", PrefillTotals(1.0, 5.0, 1000.0)) is None
    deltas.forget("r")
    assert deltas.update("r", PrefillTotals(2.0, 9.0, 2000.0)) is None


def test_an_interval_with_no_request_finished_adds_its_tokens_to_the_next() -> None:
    """Tokens counted at scheduling for a request that has not finished by the scrape belong
    to the interval in which its time is counted (module docstring)."""
    for aligned in (True, False):
        deltas = PrefillDeltas()
        assert deltas.update("r", PrefillTotals(1.0, 1.0, 100.0, aligned), 0) is None
        assert deltas.update("r", PrefillTotals(1.0, 1.0, 600.0, aligned), 0) is None
        assert deltas.update("r", PrefillTotals(1.2, 2.0, 600.0, aligned), 0) == PrefillDelta(
            500.0, 1, pytest.approx(0.2)
        )


def test_tokens_counted_apart_wait_until_the_interval_has_settled() -> None:
    """An interval of tokens counted apart from its times is given once it spans SETTLED_SPAN
    times ``|n_end - n_start| + sqrt(n_start + n_end)`` finished requests (n: in flight at its
    ends); between idle scrapes at once; aligned totals, and a page that does not say what is
    in flight, at every interval (module docstring)."""

    def given(flights: tuple[int, int], requests: int) -> bool:
        deltas = PrefillDeltas()
        deltas.update("r", PrefillTotals(0.0, 0.0, 0.0, False), flights[0])
        totals = PrefillTotals(1.0, requests, 100.0 * requests, False)
        return deltas.update("r", totals, flights[1]) is not None

    assert SETTLED_SPAN == 8  # the cases below are worked out for it
    assert given((0, 0), 1)  # idle at both ends: exact
    assert not given((1, 1), 11) and given((1, 1), 12)  # 8 x sqrt(2) = 11.3
    assert not given((64, 64), 90) and given((64, 64), 91)  # 8 x sqrt(128) = 90.5
    assert not given((0, 10), 105) and given((0, 10), 106)  # 8 x (10 + sqrt(10)) = 105.3
    assert not given((10, 0), 105) and given((10, 0), 106)
    # Not settled yet: the next scrape's interval starts from the same baseline.
    deltas = PrefillDeltas()
    deltas.update("r", PrefillTotals(0.0, 0.0, 0.0, False), 1)
    assert deltas.update("r", PrefillTotals(1.0, 11.0, 900.0, False), 1) is None
    assert deltas.update("r", PrefillTotals(2.0, 12.0, 1000.0, False), 1) == PrefillDelta(
        1000.0, 12, 2.0
    )
    for totals, flight in ((PrefillTotals(3.0, 13.0, 1200.0, True), 5),
                           (PrefillTotals(3.5, 14.0, 1300.0, False), None)):  # fmt: skip
        assert deltas.update("r", totals, flight) is not None


def test_a_prompt_count_that_dips_under_the_hits_is_no_restart() -> None:
    """An engine that counts prefix-cache hits at scheduling and prompt tokens at the end (as
    llm-d-inference-sim does): while a request with a cached prefix runs, prompt tokens less
    hits go down. Its counters did not begin again; queries less hits never go down."""
    running = VLLM_OLDER.replace(
        'queries_total{model_name="m"} 5000.0', 'queries_total{model_name="m"} 6000.0'
    )
    running = running.replace("hits_total{model_name=\"m\"} 1000.0",
                              "hits_total{model_name=\"m\"} 1900.0")  # fmt: skip
    deltas = PrefillDeltas()
    deltas.update("r", parse_engine_load(VLLM_OLDER).prefill)
    assert not deltas.restarted("r", parse_engine_load(running).prefill)


async def test_scraped_prefill_times_teach_the_rate_without_a_first_token(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """Plain (unstreamed) answers come whole: the gateway measures no first token, so only the
    emulated engine's ``vllm:request_prefill_time_seconds`` can teach the router its rate
    (20,000 tokens/s of wall time here). Each answer's whole time is an observation, but such
    answers warm no replica up (core/speed.py): with scraping off, the rate stays the prior."""
    engine = ReplicaConfig(block_size=16)  # 10,000 tokens/s, at half time: 20,000 of wall
    learned = {}
    for scrape in (True, False):
        cluster = await make_cluster(1, EmulatorConfig(engine, time_scale=0.5))
        gw = await make_gateway(cluster.urls, scrape_metrics=scrape, health_interval_s=0.05)
        speed = gw.router.replica_load(gw.registry.find(cluster.urls[0]).id).speed
        for i in range(24):
            body = {"prompt": f"q{i} " + words(400 + 100 * (i % 8)), "max_tokens": 1}
            reply = await send(session, gw.url, "/v1/completions", body)
            assert reply.complete, reply
            await asyncio.sleep(0.1)  # a scrape between requests: intervals of one or two
        assert speed.whole_observations == speed.prefill_observations == 24  # none measured
        assert speed.ttft_predictions == 0  # a whole answer's time is no first token's
        learned[scrape] = (speed.prefill_tokens_per_s, speed.engine_observations)
    rate, intervals = learned[True]
    assert intervals >= 8 and rate == pytest.approx(20_000.0, rel=0.25), learned
    assert learned[False] == (10_000.0, 0)


# vLLM's cache config as an info gauge, labels as vLLM writes them (here a version with
# kv_cache_size_tokens), over two data-parallel engines.
VLLM_CACHE = exposition("vllm_cache_config.prom")


def test_the_kv_cache_size_from_vllm_and_sglang_names() -> None:
    """The tokens an engine's KV cache holds: vLLM's kv_cache_size_tokens label, else
    num_gpu_blocks x block_size, summed over engines; SGLang's max_total_num_tokens."""
    assert parse_engine_load(VLLM_CACHE).kv_tokens == 2 * 10_576
    older = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="661",engine="0"} 1.0\n'
    assert parse_engine_load(older).kv_tokens == 661 * 16
    sglang = 'sglang:max_total_num_tokens{name="m"} 161721.0\n'
    assert parse_engine_load(sglang).kv_tokens == 161_721
    # Not known yet ("None" before the engine profiled its memory), or not for every engine:
    # a sum that leaves an engine out would be too small.
    unknown = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0\n'
    assert parse_engine_load(unknown).kv_tokens is None
    partly = older + unknown.replace("}", ',engine="1"}')
    assert parse_engine_load(partly).kv_tokens is None
    assert parse_engine_load(VLLM).kv_tokens is None  # a page without it


async def test_each_replicas_index_grows_to_its_engines_kv_cache(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory
) -> None:
    """An emulated replica with 2,048 blocks of 16 tokens (32,768 tokens of KV cache): in
    approximate mode at the prior 4 characters a token, 64-character blocks hold 16 tokens, so
    2,048 index blocks hold its cache. Configured at 1,024 the index grows to 2,048; with the
    setting off, or scraping off, 1,024 stay; configured at 4,096 (larger than the cache) it is
    not shrunk while the characters per token are the prior's (no answer yet: the prior can be
    several times off, and an index sized down at it forgets prefixes the replica holds)."""
    engine = ReplicaConfig(kv_capacity_blocks=2048, block_size=16)
    cases = {
        "grown": {"index_capacity_blocks": 1024},
        "off": {"index_capacity_blocks": 1024, "index_capacity_from_engine": False},
        "no scrape": {"index_capacity_blocks": 1024, "scrape_metrics": False},
        "larger kept": {"index_capacity_blocks": 4096},
    }
    sizes = {}
    for name, settings in cases.items():
        cluster = await make_cluster(1, EmulatorConfig(engine))
        gw = await make_gateway(cluster.urls, health_interval_s=0.05, **settings)
        rid = gw.registry.find(cluster.urls[0]).id
        load = gw.router.replica_load(rid)
        async with asyncio.timeout(5):
            while load.kv_usage is None and settings.get("scrape_metrics", True):
                await asyncio.sleep(0.02)  # a scrape has come in
        await asyncio.sleep(0.1)
        sizes[name] = gw.router.index_size(rid)
    assert sizes == {"grown": 2048, "off": 1024, "no scrape": 1024, "larger kept": 4096}


async def test_an_index_larger_than_the_cache_shrinks_once_the_ratio_is_learned(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """Configured at 16,384 blocks, 8x the 32,768 tokens the engine's cache holds at 4
    characters a token: after MIN_ANSWERS answers the index keeps the cache's tokens at the
    learned characters per token (gateway/_index_size.py: an index several times the cache sends
    requests after hits the replica evicted), and not before."""
    engine = ReplicaConfig(kv_capacity_blocks=2048, block_size=16)
    cluster = await make_cluster(1, EmulatorConfig(engine))
    gw = await make_gateway(cluster.urls, health_interval_s=0.05, index_capacity_blocks=16384)
    rid = gw.registry.find(cluster.urls[0]).id
    load = gw.router.replica_load(rid)
    async with asyncio.timeout(5):
        while load.kv_usage is None:
            await asyncio.sleep(0.02)  # a scrape has come in
    sizes = []
    for i in range(MIN_ANSWERS):
        await asyncio.sleep(0.15)  # a health round or two: the size as of i answers
        sizes.append(gw.router.index_size(rid))
        body = {"prompt": f"q{i} " + words(300), "max_tokens": 1}
        assert (await send(session, gw.url, "/v1/completions", body)).complete
    assert sizes == [16384] * MIN_ANSWERS  # the prior's ratio: kept
    ratio = gw.router.chars_per_token_of(None)
    assert ratio != 4.0  # learned: the emulator counts a word a token, words run 4-5 characters
    want = index_blocks_for(32768, 64, ratio)
    async with asyncio.timeout(5):
        while gw.router.index_size(rid) != want:
            await asyncio.sleep(0.02)
    assert want < 16384 / 4


async def test_an_emulated_engine_s_preemptions_reach_the_router(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """An emulated replica that preempts (``preempt``: vLLM's on-demand KV blocks) with a
    256-token cache, sent four answers of up to 160 tokens at once: their blocks outgrow the
    cache as they decode, so it preempts. The gateway's scrapes read its
    ``vllm:num_preemptions_total`` and the router counts them (core/preemptions.py); every
    answer still comes whole."""
    engine = ReplicaConfig(kv_capacity_blocks=16, block_size=16, preempt=True)
    cluster = await make_cluster(1, EmulatorConfig(engine, time_scale=0.1))
    gw = await make_gateway(cluster.urls, health_interval_s=0.02)
    rid = gw.registry.find(cluster.urls[0]).id
    load = gw.router.replica_load(rid)
    async with asyncio.timeout(5):
        while load.kv_usage is None:  # scraped once: the count's baseline is set
            await asyncio.sleep(0.01)
    bodies = [{"prompt": f"q{i} " + words(30), "max_tokens": 120, "stream": True} for i in range(4)]
    replies = await asyncio.gather(*(send(session, gw.url, "/v1/completions", b) for b in bodies))
    assert all(r.complete for r in replies), replies
    async with asyncio.timeout(5):
        while load.preemptions == 0:
            await asyncio.sleep(0.01)
    assert gw.registry.describe(gw.registry.get(rid))["speed"]["preemptions"] > 0  # admin API


# Pages an engine (or something posing as one) may serve that hold numbers no count can be.
ODD_PAGES = {
    "nan and infinite counts": (
        'vllm:num_requests_running{model_name="m"} NaN\n'
        'vllm:num_requests_waiting{model_name="m"} +Inf\n'
        'vllm:kv_cache_usage_perc{model_name="m"} NaN\n'
    ),
    "negative counts": (
        'vllm:num_requests_running{model_name="m"} -3\n'
        'vllm:num_preemptions_total{model_name="m"} -1\n'
    ),
    "nan prefill counters": VLLM_PREFILL.replace(" 15.0", " NaN"),
    "a kv cache past any machine": 'sglang:max_total_num_tokens{name="m"} 1e30\n',
    "a block count past any machine": (
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="1000000000000000000000"} 1.0\n'
    ),
}


@pytest.mark.parametrize("page", ODD_PAGES.values(), ids=list(ODD_PAGES))
def test_numbers_no_count_can_be_are_no_reading(page: str) -> None:
    """A NaN, an infinity or a negative count is left out, as a page without it, and a KV
    cache larger than any machine's is not believed (it would size the index past memory)."""
    load = parse_engine_load(page)
    assert (load.num_running, load.num_waiting, load.kv_usage) == (None, None, None)
    assert load.kv_tokens is None and load.preemptions == 0
    if load.prefill is not None:  # the NaN count left out: no interval is made of it
        assert load.prefill.requests == load.prefill.requests  # not NaN


async def test_a_replica_with_an_odd_metrics_page_is_served_and_can_come_back(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """One replica's /metrics must neither stop the gateway from starting nor keep the replica
    out of rotation once its /health answers again."""
    page = {"text": "".join(ODD_PAGES.values())}

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.path == "/metrics":
            return web.Response(text=page["text"], content_type="text/plain")
        return web.Response(body=completion_body(), content_type="application/json")

    odd = await make_fake(handler=handler)
    fine = await make_fake()
    gw = await make_gateway([odd.url, fine.url])  # starts: before, the first round raised
    record = gw.registry.find(odd.url)
    assert record.healthy
    served = set()
    for i in range(8):
        async with session.post(gw.url + "/v1/completions", json={"prompt": f"p{i}"}) as r:
            assert r.status == 200
            served.add(r.headers["x-prefixroute-replica"])
    assert odd.url in served
    odd.failing = True  # its health fails: out of rotation
    async with asyncio.timeout(5):
        while record.healthy:
            await asyncio.sleep(0.02)
    odd.failing = False  # answering again, the page still odd: back in
    async with asyncio.timeout(5):
        while not record.healthy:
            await asyncio.sleep(0.02)


async def test_a_full_batch_of_unknown_size_is_learned_within_seconds(
    make_fake: FakeFactory, make_gateway: GatewayFactory
) -> None:
    """A replica whose scrapes show requests waiting while its batch size is not known is
    scraped every 0.25 s, not only each health round (gateway/_health.py): its size is learned
    from 8 such reports in about 2 s, where rounds of 60 s would take 8 minutes. A replica whose
    batch has room is not scraped more often than its rounds."""
    scrapes = {"full": 0, "room": 0}

    def engine(kind: str, waiting: int) -> Handler:
        async def pages(request: web.Request) -> web.StreamResponse:
            if request.path != "/metrics":
                return web.Response(body=completion_body(), content_type="application/json")
            scrapes[kind] += 1
            text = (f'vllm:num_requests_running{{model_name="m"}} 4\n'
                    f'vllm:num_requests_waiting{{model_name="m"}} {waiting}\n')  # fmt: skip
            return web.Response(text=text, content_type="text/plain")

        return pages

    full = await make_fake(handler=engine("full", 3))
    room = await make_fake(handler=engine("room", 0))
    gw = await make_gateway([full.url, room.url], health_interval_s=60)
    full_load = gw.router.loads.get(gw.registry.find(full.url).id)
    async with asyncio.timeout(10):
        while full_load.slots.size is None:
            await asyncio.sleep(0.05)
    assert full_load.slots.size == 4 and full_load.slots.source == "learned"
    assert scrapes["full"] >= 8
    await asyncio.sleep(0.6)  # known now: no more scrapes between rounds
    assert scrapes["full"] <= 10 and scrapes["room"] == 1  # the first round's
    assert gw.router.loads.get(gw.registry.find(room.url).id).slots.size is None
