"""Leader election (``--ha-enable-leader-election``, docs/kubernetes.md "Active-passive").

From the spec (the Inference Extension's picker, ``cmd/epp/runner/health.go``, and the module
docstring of ``epp/_leader.py``): one candidate leads at a time; only the leader's ``readiness``,
``""`` and ext_proc health services are serving, ``liveness`` always is; a leader that stops
releases the Lease so a standby takes over; one that cannot renew steps down and a standby takes
over once the lease runs out; an unreachable API server makes nobody leader and kills nothing.
The election runs on the real ``kubernetes`` client against a fake Lease API (``lease_api``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from polling import until

from prefixroute.core import ConfigError
from prefixroute.epp import EndpointPicker, LeaseElector

from .conftest import PickerFactory, side
from .envoy import free_port
from .lease_api import LeaseAPI

pytest.importorskip("kubernetes.leaderelection")

FAST = (3, 2, 1)  # lease, renew deadline, retry (s): the shortest the client allows
Candidate = tuple[LeaseElector, list[bool]]  # an elector and the changes it announced
SERVICES = ("", "liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor")


def wait_for(cond: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture
def lease_api() -> Iterator[LeaseAPI]:
    with LeaseAPI() as api:
        yield api


@pytest.fixture
def electors(lease_api: LeaseAPI) -> Iterator[Callable[[int], list[Candidate]]]:
    started: list[LeaseElector] = []

    def make(n: int) -> list[Candidate]:
        out = []
        for i in range(n):
            changes: list[bool] = []
            e = LeaseElector("prefixroute-epp", "default", changes.append, identity=f"picker-{i}",
                             timings=FAST, api=lease_api.client())  # fmt: skip
            e.start()
            started.append(e)
            out.append((e, changes))
        return out

    yield make
    for e in started:
        e.stop()


def leaders(pairs: list[Candidate]) -> list[str]:
    return [e.identity for e, _ in pairs if e.leading]


def test_one_leader_and_the_lease_names_it(lease_api: LeaseAPI, electors: Any) -> None:
    pairs = electors(2)
    wait_for(lambda: len(leaders(pairs)) == 1)
    time.sleep(2.5)  # more than two retries: the standby keeps standing by
    (leader,) = leaders(pairs)
    assert lease_api.holder() == leader
    for e, changes in pairs:
        assert changes == ([True] if e.identity == leader else [])


def test_a_stopping_leader_releases_and_a_standby_takes_over(
    lease_api: LeaseAPI, electors: Any
) -> None:
    pairs = electors(2)
    wait_for(lambda: len(leaders(pairs)) == 1)
    (old, old_changes), (new, new_changes) = sorted(pairs, key=lambda p: not p[0].leading)
    old.stop()
    assert old_changes == [True, False] and not old.leading
    assert lease_api.holder() != old.identity  # released at once, not left to run out
    wait_for(lambda: new.leading)
    assert new_changes == [True] and lease_api.holder() == new.identity


def test_a_leader_that_cannot_renew_steps_down(lease_api: LeaseAPI, electors: Any) -> None:
    pairs = electors(2)
    wait_for(lambda: len(leaders(pairs)) == 1)
    (old, old_changes), (new, new_changes) = sorted(pairs, key=lambda p: not p[0].leading)
    lease_api.refuse_holder = old.identity  # its renewals fail, as when its node is cut off
    wait_for(lambda: new.leading)  # after the lease it can no longer renew runs out
    wait_for(lambda: not old.leading)
    assert old_changes == [True, False] and new_changes == [True]
    lease_api.refuse_holder = None
    time.sleep(2.5)  # the old leader contends again, and stands by while the lease is held
    assert leaders(pairs) == [new.identity] and lease_api.holder() == new.identity
    new.stop()
    wait_for(lambda: old.leading)  # still in the running: it leads again
    assert old_changes == [True, False, True]


def test_no_api_server_no_leader_and_the_election_survives(
    lease_api: LeaseAPI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "prefixroute.epp._leader")
    from kubernetes import client

    config = client.Configuration()
    config.host = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    config.retries = 0
    changes: list[bool] = []
    unreachable = client.CoordinationV1Api(client.ApiClient(config))
    nowhere = LeaseElector("prefixroute-epp", "default", changes.append, identity="lost",
                           timings=FAST, api=unreachable)  # fmt: skip
    lease_api.down = True  # and this one answers 503
    down = LeaseElector("prefixroute-epp", "default", changes.append, identity="waiting",
                        timings=FAST, api=lease_api.client())  # fmt: skip
    try:
        nowhere.start()
        down.start()
        time.sleep(2.5)
        assert changes == [] and lease_api.leases == {}
        failures = [r for r in caplog.records if "the Lease API failed" in r.getMessage()]
        assert len(failures) == 1  # once per failing streak, not once per try
        lease_api.down = False
        wait_for(lambda: down.leading)
        assert changes == [True] and not nowhere.leading
    finally:
        nowhere.stop()
        down.stop()


def test_timings_the_client_would_exit_on_are_a_config_error() -> None:
    for timings in ((3, 2, 0), (3, 1, 1), (2, 2, 1)):
        with pytest.raises(ConfigError, match="leader election needs"):
            LeaseElector("x", "default", lambda _: None, timings=timings)


async def health(port: int) -> dict[str, str]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        out = {}
        for service in SERVICES:
            answer = await stub.Check(health_pb2.HealthCheckRequest(service=service))
            out[service] = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
        return out


STANDBY = {"": "NOT_SERVING", "liveness": "SERVING", "readiness": "NOT_SERVING",
           "envoy.service.ext_proc.v3.ExternalProcessor": "NOT_SERVING"}  # fmt: skip
LEADING = dict.fromkeys(SERVICES, "SERVING")


async def test_the_picker_is_ready_only_while_it_leads(make_picker: PickerFactory) -> None:
    epp: EndpointPicker = await make_picker(epp={"leader_election": True})
    metrics = f"{side(epp)}/metrics"
    async with aiohttp.ClientSession() as session:

        async def state() -> tuple[dict[str, str], int, Any, str]:
            async with session.get(f"{side(epp)}/health") as h, session.get(metrics) as m:
                gauge = next(line for line in (await m.text()).splitlines()
                             if line.startswith("prefixroute_epp_leader "))  # fmt: skip
                return await health(epp.grpc_port), h.status, await h.json(), gauge

        await until(lambda: all(r.healthy for r in epp.registry))
        n = len(epp.registry)
        assert await state() == (STANDBY, 503, {"healthy_endpoints": n, "leader": False},
                                 "prefixroute_epp_leader 0.0")  # fmt: skip
        await epp.lead(True)
        assert await state() == (LEADING, 200, {"healthy_endpoints": n, "leader": True},
                                 "prefixroute_epp_leader 1.0")  # fmt: skip
        await epp.lead(False)
        assert (await state())[:2] == (STANDBY, 503)


async def test_without_an_election_every_picker_serves(make_picker: PickerFactory) -> None:
    epp: EndpointPicker = await make_picker()
    assert await health(epp.grpc_port) == LEADING
    async with aiohttp.ClientSession() as session, session.get(f"{side(epp)}/health") as h:
        assert "leader" not in await h.json()


def _prefixroute() -> str:
    return shutil.which("prefixroute", path=os.path.dirname(sys.executable)) or "prefixroute"


async def test_two_picker_processes_one_ready_then_the_other(
    lease_api: LeaseAPI, tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(lease_api.kubeconfig())
    env = dict(os.environ, KUBECONFIG=str(kubeconfig))
    ports = [free_port()]
    while (port := free_port()) == ports[0]:  # two binds of port 0 may both get one port
        pass
    ports.append(port)
    logs = [tmp_path / f"picker-{i}.log" for i in range(2)]  # what each said, for a failure
    procs = []
    for port, log in zip(ports, logs, strict=True):
        with log.open("wb") as stderr:  # the process has its own copy
            procs.append(subprocess.Popen(
                [_prefixroute(), "epp", "--endpoint", "127.0.0.1:9", "--grpc-port", str(port),
                 "--http-port", "0", "--ha-enable-leader-election", "--k8s-namespace", "team"],
                env=env, stdout=subprocess.DEVNULL, stderr=stderr,
            ))  # fmt: skip

    def said() -> str:
        return "\n".join(f"picker {i} (exit {p.poll()}):\n{log.read_text()[-3000:]}"
                         for i, (p, log) in enumerate(zip(procs, logs, strict=True)))  # fmt: skip

    try:

        async def ready() -> list[bool]:
            out = []
            for port in ports:
                try:
                    out.append((await health(port))["readiness"] == "SERVING")
                except grpc.aio.AioRpcError:
                    out.append(False)  # not listening (yet, or any more)
            return out

        async def one_ready() -> bool:
            return sum(await ready()) == 1

        try:
            await until(one_ready, timeout_s=60, every_s=0.2)
        except AssertionError as exc:
            state = f"ready: {await ready()}, Lease writes {lease_api.writes}"
            raise AssertionError(f"{state}\n{said()}") from exc
        leader = (await ready()).index(True)
        holder = lease_api.holder("team")
        assert holder is not None and holder.startswith(os.uname().nodename + "_")
        procs[leader].send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(procs[leader].wait, 30) == 0
        last = max(i for i, w in enumerate(lease_api.writes) if w == holder)
        assert lease_api.writes[last + 1] is None  # it released the Lease on its way out
        # The standby takes over at its next try (every 2 s), not when the 15 s lease ends.
        started = time.monotonic()
        await until(one_ready, timeout_s=10, every_s=0.2)
        assert (await ready())[1 - leader] and time.monotonic() - started < 10
        assert lease_api.holder("team") not in (None, holder)
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)
