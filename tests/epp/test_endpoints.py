"""Static and file discovery: the registry's membership follows what a source sees."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest
from polling import until

from prefixroute.commands.epp import add_parser, config_from_args
from prefixroute.core import ConfigError, SpeedPrior
from prefixroute.epp import (
    EndpointPicker,
    EndpointSet,
    FileEndpoints,
    endpoint_of,
    read_endpoints_file,
    replica_of,
)

from .support import shared


def test_endpoint_and_replica_ids_round_trip() -> None:
    assert replica_of("10.0.0.7:8000") == "http://10.0.0.7:8000"
    assert endpoint_of(replica_of("10.0.0.7:8000")) == "10.0.0.7:8000"
    assert replica_of("http://[fd00::1]:8000/") == "http://[fd00::1]:8000"
    with pytest.raises(ConfigError):
        replica_of("ftp://x:1")


@pytest.mark.parametrize("name", ["localhost:8000", "vllm-0.vllm.inference.svc:8000",
                                  "http://vllm:8000"])  # fmt: skip
def test_a_host_name_is_no_endpoint(name: str) -> None:
    """The protocol's destination is ``<ip:port>``, and Envoy's ORIGINAL_DST cluster resolves
    no name: a picker that named ``localhost:18501`` had every request answered 503."""
    with pytest.raises(ConfigError, match="an address and not a name"):
        replica_of(name)


def test_apply_adds_and_removes_and_reports_new_ones() -> None:
    s = shared(endpoints=())
    seen: list[str] = []
    target = EndpointSet(s.registry, lambda record: seen.append(record.id))
    assert target.apply(["10.0.0.1:80", "10.0.0.2:80"]) == (
        ["http://10.0.0.1:80", "http://10.0.0.2:80"], []
    )  # fmt: skip
    assert target.apply(["10.0.0.2:80", "10.0.0.3:80", "bad endpoint"]) == (
        ["http://10.0.0.3:80"], ["http://10.0.0.1:80"]
    )  # fmt: skip
    assert sorted(s.router.replicas) == ["http://10.0.0.2:80", "http://10.0.0.3:80"]
    assert seen == ["http://10.0.0.1:80", "http://10.0.0.2:80", "http://10.0.0.3:80"]
    assert target.apply(["10.0.0.3:80", "10.0.0.2:80"]) == ([], [])


def test_the_file_lists_one_endpoint_per_line(tmp_path: Path) -> None:
    path = tmp_path / "endpoints"
    path.write_text("# the pool\n10.0.0.1:8000\n\n10.0.0.2:8000  # second\n")
    assert read_endpoints_file(path) == ["10.0.0.1:8000", "10.0.0.2:8000"]
    with pytest.raises(ConfigError, match="cannot read"):
        read_endpoints_file(tmp_path / "missing")


def test_the_file_is_applied_again_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "endpoints"
    path.write_text("10.0.0.1:8000\n")
    s = shared(endpoints=())
    watcher = FileEndpoints(str(path), EndpointSet(s.registry))
    assert watcher.poll() is True
    assert s.router.replicas == ["http://10.0.0.1:8000"]
    assert watcher.poll() is False  # unchanged
    path.write_text("10.0.0.2:8000\n")
    os.utime(path, (1, 1))  # a new mtime even within the clock's resolution
    assert watcher.poll() is True
    assert s.router.replicas == ["http://10.0.0.2:8000"]
    path.unlink()
    assert watcher.poll() is False  # a file replaced atomically may vanish for a moment
    assert s.router.replicas == ["http://10.0.0.2:8000"]


def test_a_file_missing_at_start_is_a_config_error(tmp_path: Path) -> None:
    # It used to start a picker with no endpoints and say nothing: every request then failed.
    s = shared(endpoints=())
    watcher = FileEndpoints(str(tmp_path / "endpoints"), EndpointSet(s.registry))
    with pytest.raises(ConfigError, match="^cannot read the endpoints file .*: No such file"):
        watcher.start()


def test_a_file_over_16_mib_is_a_config_error(tmp_path: Path) -> None:
    """Read whole, ``--endpoints-file /dev/zero`` grew to 6.8 GB without a word (an outside
    review, 2026-12-07)."""
    with pytest.raises(ConfigError, match="^the endpoints file /dev/zero is over 16 MiB"):
        read_endpoints_file("/dev/zero")
    big = tmp_path / "endpoints"
    big.write_bytes(b"# " + b"x" * (16 << 20) + b"\n10.0.0.1:8000\n")
    with pytest.raises(ConfigError, match="over 16 MiB"):
        read_endpoints_file(big)


def test_a_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    # It was a UnicodeDecodeError: a traceback at start instead of the CLI's one-line error.
    path = tmp_path / "endpoints"
    path.write_bytes(b"\xff\xfe10.0.0.1:8000\n")
    with pytest.raises(ConfigError, match="^cannot read the endpoints file .*: not UTF-8"):
        read_endpoints_file(path)
    watcher = FileEndpoints(str(path), EndpointSet(shared(endpoints=()).registry))
    with pytest.raises(ConfigError, match="not UTF-8"):
        watcher.start()


async def test_a_bad_version_of_the_file_keeps_the_list_and_the_watch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # One non-UTF-8 version used to end the watch for good, silently: the list restored after
    # it was never read, and the picker stayed on whatever it had (here: nothing healthy).
    path = tmp_path / "endpoints"
    path.write_text("10.0.0.1:8000\n")
    s = shared(endpoints=())
    watcher = FileEndpoints(str(path), EndpointSet(s.registry), interval_s=0.001)
    watcher.start()
    try:
        path.write_bytes(b"\xff10.0.0.9:8000\n")
        os.utime(path, (1, 1))
        await until(lambda: "not UTF-8" in caplog.text)
        assert s.router.replicas == ["http://10.0.0.1:8000"]  # the last good list
        path.write_text("10.0.0.2:8000\n")
        os.utime(path, (2, 2))
        await until(lambda: s.router.replicas == ["http://10.0.0.2:8000"])
    finally:
        await watcher.stop()


async def test_an_unexpected_error_is_logged_and_the_watch_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "endpoints"
    path.write_text("10.0.0.1:8000\n")
    s = shared(endpoints=())
    target = EndpointSet(s.registry)
    watcher = FileEndpoints(str(path), target, interval_s=0.001)
    watcher.start()
    apply = target.apply

    def broken(endpoints: list[str]) -> tuple[list[str], list[str]]:
        raise RuntimeError("a bug")

    try:
        monkeypatch.setattr(target, "apply", broken)
        os.utime(path, (1, 1))
        await until(lambda: "a bug" in caplog.text)
        monkeypatch.setattr(target, "apply", apply)
        path.write_text("10.0.0.2:8000\n")
        os.utime(path, (2, 2))
        await until(lambda: s.router.replicas == ["http://10.0.0.2:8000"])
    finally:
        await watcher.stop()


def test_an_endpoint_s_speed_priors_come_with_it_or_from_the_config(tmp_path: Path) -> None:
    """Priors the config gives for an address apply when an endpoint at that address joins,
    from whichever source (here, the first file that lists it); priors its source brings (a
    pod's annotations) are its own and win; an endpoint given none predicts at the fleet's."""
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    path = tmp_path / "endpoints"
    path.write_text("")
    args = parser.parse_args([
        "epp", "--endpoints-file", str(path),
        "--replica-speed", "10.0.0.9:80=prefill_tokens_per_s=20000",
        "--replica-speed", "http://10.0.0.1:80=prefill_tokens_per_s=1000",
    ])  # fmt: skip
    epp = EndpointPicker(config_from_args(args))  # not started: nothing is probed
    assert len(epp.registry) == 0
    epp.endpoints.apply({
        "10.0.0.9:80": None,
        "10.0.0.1:80": SpeedPrior(prefill_tokens_per_s=40_000.0),
        "10.0.0.2:80": None,
    })  # fmt: skip
    rates = {
        endpoint_of(rid): epp.router.replica_load(rid).speed.config.prefill_tokens_per_s
        for rid in epp.router.replicas
    }
    fleet = epp.router.loads.speed.prefill_tokens_per_s
    assert rates == {"10.0.0.9:80": 20_000.0, "10.0.0.1:80": 40_000.0, "10.0.0.2:80": fleet}
    assert fleet not in (20_000.0, 40_000.0, 1_000.0)


def test_priors_for_an_endpoint_no_source_can_bring_are_refused(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    speed = ["--replica-speed", "10.0.0.2:80=prefill_tokens_per_s=20000"]
    args = parser.parse_args(["epp", "--endpoint", "10.0.0.1:80", *speed])
    with pytest.raises(ConfigError, match="10.0.0.2:80, which is not an --endpoint"):
        config_from_args(args)
    listed = parser.parse_args(["epp", "--endpoint", "10.0.0.2:80", *speed])
    picker = EndpointPicker(config_from_args(listed))
    only = picker.router.replicas[0]
    assert picker.router.replica_load(only).speed.config.prefill_tokens_per_s == 20_000.0
    filed = parser.parse_args(["epp", "--endpoints-file", str(tmp_path / "x"), *speed])
    assert config_from_args(filed).endpoints_file is not None  # the file may bring it later
