"""Which ext_proc messages may come when on one stream; a stream that breaks the order is refused.

Envoy sends a request's headers once, first, then its body (in the body mode it was configured
with) and maybe trailers. A stream out of that order comes from a misconfigured or misbehaving
proxy, or from anyone who reaches the picker's gRPC port, and each break cost something:

* **A second request headers message** was admitted again: its tenant's in-flight slot was taken
  twice and one never given back (three such streams locked a tenant with ``max_in_flight = 2``
  out until a restart), and the router's in-flight count with it.
* **A body with no headers before it** (Envoy's ``request_header_mode: SKIP``) has no path and
  no API key: it was routed without the tenant's authentication or cache isolation.
* **A body the picker is never sent** (``request_body_mode: NONE`` in the stream's protocol
  configuration) leaves nothing to pick on. The headers were let through unchanged, so Envoy's
  original-destination cluster went where the client's own ``x-gateway-destination-endpoint``
  said: any address the proxy can reach. (Every headers answer now removes that header too,
  for a proxy that does not say its body mode.)

* **A body cut in pieces the picker cannot wait for** (``STREAMED`` or ``BUFFERED_PARTIAL``
  and a first message that does not end the body): each piece must be answered before the next
  comes, so the pick would be made on a truncated body. Clients were told their valid JSON was
  not JSON (400), depending on how their bytes happened to arrive.

Each is answered with a 500 naming the configuration to fix: fail closed, never open.
"""

from __future__ import annotations

import logging

from prefixroute.core import PrefixrouteError
from prefixroute.epp import _protocol as proto

log = logging.getLogger(__name__)
_said: set[str] = set()  # each misconfiguration is logged once, not once a request


class MisorderedStream(PrefixrouteError):
    """A message the ext_proc protocol does not send at this point of a stream (HTTP 500)."""


def split_body(body_mode: int | None, end_of_stream: bool) -> MisorderedStream | None:
    """Why a request body message that is not the body's end cannot be picked on (None: it
    can, or another rule answers it): ``STREAMED`` and ``BUFFERED_PARTIAL`` bodies in pieces."""
    if end_of_stream or body_mode not in (proto.STREAMED, proto.BUFFERED_PARTIAL):
        return None
    return _refused(
        "the request body came in pieces (ext_proc request_body_mode STREAMED or "
        "BUFFERED_PARTIAL): the endpoint picker needs it whole; use FULL_DUPLEX_STREAMED or "
        "BUFFERED"
    )


def misordered(
    kind: str, headers_seen: bool, body_mode: int | None, headers_end: bool
) -> MisorderedStream | None:
    """Why a ``kind`` message cannot come now (None: it can). ``headers_seen``: the request's
    headers came before; ``body_mode``: the request body mode the stream's protocol
    configuration gave (None: not given); ``headers_end``: this headers message ends the
    request (no body follows)."""
    why = None
    if kind == "request_headers" and headers_seen:
        why = "a second request headers message on one ext_proc stream"
    elif kind == "request_headers" and body_mode == proto.NONE and not headers_end:
        why = (
            "the endpoint picker needs the request body to pick on, and this proxy sends it "
            "none (ext_proc request_body_mode NONE): use FULL_DUPLEX_STREAMED or BUFFERED"
        )
    elif kind in ("request_body", "request_trailers") and not headers_seen:
        why = (
            "a request body with no headers before it: the endpoint picker needs the request "
            "headers (ext_proc request_header_mode SEND)"
        )
    return None if why is None else _refused(why)


def _refused(why: str) -> MisorderedStream:
    if why not in _said:
        _said.add(why)
        log.warning("ext_proc stream refused (logged once): %s", why)
    return MisorderedStream(why)
