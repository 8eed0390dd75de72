"""A stand-in for the Redis sync and for a Ray ledger's listener, which hear the same four
calls of a request (decision, withdrawal, first token, end): what it heard, in order."""

from __future__ import annotations

from typing import Any


class Heard:
    def __init__(self) -> None:
        self.heard: list[tuple[str, str]] = []

    def routed(self, view: Any, decision: Any) -> None:
        self.heard.append(("routed", view.request_id))

    def withdrawn(self, request_id: str) -> None:
        self.heard.append(("withdrawn", request_id))

    def first_token(self, request_id: str) -> None:
        self.heard.append(("first_token", request_id))

    def completed(self, request_id: str) -> None:
        self.heard.append(("completed", request_id))
