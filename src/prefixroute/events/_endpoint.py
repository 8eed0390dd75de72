"""Where one replica's KV events come from: a ZMQ address, who binds, and the replay socket.

Either side may bind. vLLM binds its PUB socket when its endpoint has a wildcard
(``tcp://*:5557``) and connects otherwise (``tcp://gateway:5557``), so the spec names our side::

    bind:tcp://127.0.0.1:5557                  we bind, the engine connects to us
    connect:tcp://10.0.0.11:5557               the engine binds, we connect
    connect:tcp://10.0.0.11:5557,replay=tcp://10.0.0.11:5558,topic=kv

``replay`` is the engine's ROUTER socket (vLLM's ``replay_endpoint``), always connected to; it
lets a subscriber that missed sequence numbers ask for them again. ``topic`` filters by prefix.
A bind address may use port ``*`` (any free port); the bound address is readable once started.
"""

from __future__ import annotations

from dataclasses import dataclass

from prefixroute.events._errors import BadEndpoint

_SCHEMES = ("tcp://", "ipc://", "inproc://")


@dataclass(frozen=True, slots=True)
class EventEndpoint:
    address: str  # ZMQ address of the event stream, e.g. "tcp://127.0.0.1:5557"
    bind: bool  # True: we bind and the engine connects; False: we connect to the engine
    replay: str | None = None  # the engine's replay (ROUTER) address; None: no replay
    topic: str = ""  # topic prefix to subscribe to ("" = everything, vLLM's default)

    @classmethod
    def parse(cls, spec: str) -> EventEndpoint:
        """``bind:ADDR`` or ``connect:ADDR``, then optional ``,replay=ADDR`` and ``,topic=T``."""
        head, *options = (part.strip() for part in spec.split(","))
        mode, sep, address = head.partition(":")
        if not sep or mode not in ("bind", "connect"):
            raise BadEndpoint(f"a KV-event endpoint starts with bind: or connect:, got {spec!r}")
        _check_address(address, spec)
        replay: str | None = None
        topic = ""
        for option in options:
            key, eq, value = option.partition("=")
            if not eq:
                raise BadEndpoint(f"expected key=value after the address in {spec!r}")
            if key == "replay":
                _check_address(value, spec)
                replay = value
            elif key == "topic":
                topic = value
            else:
                raise BadEndpoint(f"unknown option {key!r} in {spec!r} (valid: replay, topic)")
        return cls(address, mode == "bind", replay, topic)

    @classmethod
    def for_publisher(cls, spec: str) -> EventEndpoint:
        """A publisher's endpoint: a spec as :meth:`parse` reads it, or a bare address that
        follows vLLM's rule (a wildcard host, ``::``, ipc or inproc binds; the rest connects)."""
        if spec.startswith(_SCHEMES):
            address, *options = spec.split(",", 1)
            bind = "*" in address or "::" in address or address.startswith(_SCHEMES[1:])
            spec = f"{'bind' if bind else 'connect'}:{spec}"
        return cls.parse(spec)

    @classmethod
    def for_host(cls, template: str, host: str) -> EventEndpoint:
        """The endpoint a ``template`` spec names for a replica at ``host`` (``{host}`` in it
        replaced: ``connect:tcp://{host}:5557`` is vLLM's default publisher on that host).
        Raises BadEndpoint for a template without ``{host}`` (every replica would share one
        address) or that is no spec. An IPv6 host is bracketed, as ZMQ addresses write it."""
        if "{host}" not in template:
            why = "it names no {host}, so every replica would share one address"
            raise BadEndpoint(f"a KV-event template like connect:tcp://{{host}}:5557: {why}")
        return cls.parse(template.replace("{host}", f"[{host}]" if ":" in host else host))

    def with_port_offset(self, offset: int) -> EventEndpoint:
        """The same endpoint ``offset`` TCP ports further on (replica ``i`` of a group), as vLLM
        offsets its endpoint by the data-parallel rank. Wildcard or port-0 binds are unchanged."""
        if not offset:
            return self
        return EventEndpoint(
            _offset(self.address, offset),
            self.bind,
            _offset(self.replay, offset) if self.replay is not None else None,
            self.topic,
        )

    def __str__(self) -> str:
        out = f"{'bind' if self.bind else 'connect'}:{self.address}"
        if self.replay is not None:
            out += f",replay={self.replay}"
        if self.topic:
            out += f",topic={self.topic}"
        return out


def _check_address(address: str, spec: str) -> None:
    if not address.startswith(_SCHEMES) or address.endswith("//"):
        raise BadEndpoint(f"a ZMQ address looks like tcp://host:port, got {address!r} in {spec!r}")
    port = address.rpartition(":")[2]
    if address.startswith("tcp://") and port.isdigit() and int(port) > 65535:  # ZMQ wrapped it
        raise BadEndpoint(f"a ZMQ address's port must be 1-65535 (or *): {address!r} in {spec!r}")


def _offset(address: str, offset: int) -> str:
    base, sep, port = address.rpartition(":")
    if not address.startswith("tcp://") or not sep or not port.isdigit() or port == "0":
        return address
    return f"{base}:{int(port) + offset}"


def is_ipv6(address: str) -> bool:
    """An address with a bracketed host (``tcp://[fd00::1]:5557``): its socket needs ZMQ's
    IPV6 option, off by default."""
    return address.startswith("tcp://[")
