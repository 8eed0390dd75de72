"""What the proxy tells whoever shares its decisions (``prefixroute.sync``): the interface."""

from __future__ import annotations

from typing import Protocol

from prefixroute.core import Decision, RequestView


class RouteListener(Protocol):
    """Hears what the router hears about each request (``_sync`` shares it with the other
    instances). Called on the request path: each method must return at once and never raise."""

    def routed(self, view: RequestView, decision: Decision) -> None: ...
    def first_token(self, request_id: str) -> None: ...
    def completed(self, request_id: str) -> None: ...

    def withdrawn(self, request_id: str) -> None:
        """The replica turned the request away (``Router.withdraw``); its end follows."""
