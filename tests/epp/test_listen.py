"""The picker's two listeners: a port it cannot have is a clear error, and leaves nothing bound."""

from __future__ import annotations

import dataclasses
import socket

import pytest
from gateway.helpers import FAST_GATEWAY

from prefixroute.core import ConfigError
from prefixroute.epp import EndpointPicker, EppConfig

from .conftest import PickerStarter

ROUTING = dataclasses.replace(FAST_GATEWAY, replicas=("http://127.0.0.1:9",))


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


async def test_a_second_picker_on_the_same_grpc_port_is_refused(
    start_picker: PickerStarter,
) -> None:
    # gRPC binds with SO_REUSEPORT by default: the second picker came up and the kernel split
    # the streams between two pickers, each with its own index and load view.
    first = await start_picker(EppConfig(ROUTING, grpc_port=0, http_port=None))
    with pytest.raises(ConfigError) as refused:
        await start_picker(EppConfig(ROUTING, grpc_port=first.grpc_port, http_port=None))
    assert str(refused.value) == (
        f"cannot listen on 127.0.0.1:{first.grpc_port}: address already in use"
    )


async def test_a_taken_http_port_stops_what_had_started() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        epp = EndpointPicker(EppConfig(ROUTING, grpc_port=0, http_port=port))
        with pytest.raises(ConfigError, match=f"^cannot listen on 127.0.0.1:{port}: address"):
            async with epp:
                pass
    assert epp.grpc_port and _bindable(epp.grpc_port), "the gRPC port was left bound"

