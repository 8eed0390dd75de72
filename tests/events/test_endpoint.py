"""Tests for prefixroute.events._endpoint: who binds, where, replay and topic."""

from __future__ import annotations

import pytest

from prefixroute.core import ConfigError
from prefixroute.events import BadEndpoint, EventEndpoint


def test_parse_and_print_round_trip() -> None:
    spec = "connect:tcp://10.0.0.11:5557,replay=tcp://10.0.0.11:5558,topic=kv"
    ep = EventEndpoint.parse(spec)
    assert ep == EventEndpoint("tcp://10.0.0.11:5557", False, "tcp://10.0.0.11:5558", "kv")
    assert str(ep) == spec
    assert EventEndpoint.parse("bind:tcp://127.0.0.1:*").bind


@pytest.mark.parametrize(
    "spec",
    [
        "tcp://127.0.0.1:5557",  # no mode: the gateway must say which side binds
        "listen:tcp://127.0.0.1:5557",
        "bind:127.0.0.1:5557",
        "bind:tcp://",
        "bind:tcp://127.0.0.1:1,replay",
        "bind:tcp://127.0.0.1:1,color=red",
        "bind:tcp://127.0.0.1:1,replay=localhost:2",
    ],
)
def test_malformed_specs_are_config_errors(spec: str) -> None:
    with pytest.raises(BadEndpoint):
        EventEndpoint.parse(spec)
    assert issubclass(BadEndpoint, ConfigError)


def test_a_publisher_may_use_vllms_rule() -> None:
    assert EventEndpoint.for_publisher("tcp://*:5557").bind
    assert not EventEndpoint.for_publisher("tcp://gateway:5557").bind
    assert EventEndpoint.for_publisher("ipc:///tmp/kv").bind
    assert EventEndpoint.for_publisher("bind:tcp://h:1").bind


def test_port_offsets_for_a_group_of_replicas() -> None:
    ep = EventEndpoint.parse("bind:tcp://127.0.0.1:5600,replay=tcp://127.0.0.1:5700")
    assert ep.with_port_offset(2) == EventEndpoint(
        "tcp://127.0.0.1:5602", True, "tcp://127.0.0.1:5702"
    )
    wildcard = EventEndpoint.parse("bind:tcp://127.0.0.1:*")
    assert wildcard.with_port_offset(3) == wildcard
