"""``bench --plain SHARE``: that share of the requests asks for no stream (bench/_replay.py).

From its docstring: drawn per request from the seed; a plain answer has an end and usage but
no TTFT, so TTFT and the SLO are over the streamed requests; its prefill still counts.
"""

from __future__ import annotations

import pytest

from prefixroute.bench import ReplayConfig, replay
from prefixroute.cli import main
from prefixroute.core import DEFAULT_POLICY
from prefixroute.emulate import EmulatorConfig, start_replicas
from prefixroute.gateway import Gateway, GatewayConfig
from prefixroute.sim import summarize
from prefixroute.sim.replica import ReplicaConfig
from prefixroute.sim.workloads import make_workload

SCALE = 0.05  # wall seconds per workload second


async def test_half_plain_through_a_gateway() -> None:
    workload = make_workload("multi-turn", 0, {"sessions": "12"})
    cluster = await start_replicas(2, EmulatorConfig(ReplicaConfig(), time_scale=SCALE))
    try:
        cfg = GatewayConfig(port=0, replicas=tuple(cluster.urls), policy=DEFAULT_POLICY)
        async with Gateway(cfg) as gw:
            replay_cfg = ReplayConfig(gw.url, time_scale=SCALE, plain=0.5, seed=3)
            result = await replay(workload, replay_cfg, "gw")
            load = sum(
                gw.router.replica_load(r).speed.whole_observations for r in gw.router.replicas
            )
    finally:
        await cluster.stop()
    assert result.errors == []
    recs = result.run.records
    plain = [r for r in recs if r.plain]
    assert 0.3 * len(recs) < len(plain) < 0.7 * len(recs)
    for rec in recs:
        assert rec.finish_s is not None and rec.replica  # answered, through the gateway
        assert (rec.first_token_s is None) == rec.plain  # a plain answer's is not seen
        assert rec.cached_reported  # a plain answer's usage has its cached tokens too
    assert any(r.cached_tokens > 0 for r in plain)
    assert load > 0  # the gateway learned from whole answers: they really were plain
    m = summarize(result.run, None)
    assert m.completed == len(recs)
    assert m.prefill_tokens == sum(r.prompt_tokens - r.cached_tokens for r in recs)
    # The same draw whatever order the requests went in.
    again = await _draws(workload, plain=0.5, seed=3)
    assert again == {r.request_id for r in plain}


async def _draws(workload: object, plain: float, seed: int) -> set[str]:
    from prefixroute.bench._replay import _Replay

    run = _Replay(ReplayConfig("http://unused", plain=plain, seed=seed), None)
    ids = [f"{s.session_id}/{i}" for s in workload.sessions for i in range(len(s.turns))]  # type: ignore[attr-defined]
    return {i for i in reversed(ids) if run.is_plain(i)}


@pytest.mark.parametrize("share", ["-0.1", "1.5"])
def test_the_plain_share_is_a_share(share: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--plain", share, "-w", "seed-conversation"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--plain" in err, err
