"""Watching a relayed server-sent-event stream without re-encoding it.

:class:`SSEScanner` sits between the upstream and the client. Each chunk the upstream sends goes
out at once, cut only at the last event boundary inside it: a client never holds half an event
when the upstream dies, so the gateway can always end the stream with a clean error event.
Upstreams (vLLM, SGLang, the emulator) write whole events per chunk, so the cut delays nothing
in practice; an event split across chunks waits only for its own end.

While relaying it notes the first ``data:`` event (the first token, for the load view) and the
``cached_tokens`` of any event carrying ``usage`` (the final chunk, with vLLM). Events are
parsed as JSON only when they mention ``"usage"``; the rest is a byte search.
"""

from __future__ import annotations

import json

from prefixroute.gateway._usage import Usage, usage_of


class SSEScanner:
    def __init__(self) -> None:
        self._tail = b""  # bytes after the last complete event, bytes
        self.saw_data = False  # a data event went by (the first token)
        self.usage: Usage | None = None  # the last usage-bearing event's

    @property
    def cached_tokens(self) -> int | None:
        """``usage.prompt_tokens_details.cached_tokens`` of the last usage-bearing event."""
        return self.usage.cached_tokens if self.usage is not None else None

    def feed(self, chunk: bytes) -> bytes:
        """The complete events that ``chunk`` finishes; the rest waits for the next chunk."""
        data = self._tail + chunk if self._tail else chunk
        end = _last_boundary_end(data)
        if end == 0:
            self._tail = data
            return b""
        ready, self._tail = data[:end], data[end:]
        if not self.saw_data and b"data:" in ready:
            self.saw_data = True
        if b'"usage"' in ready:
            self._read_usage(ready)
        return ready

    def flush(self) -> bytes:
        """What is left when the upstream ends cleanly (relayed as is)."""
        tail, self._tail = self._tail, b""
        if tail and not self.saw_data and b"data:" in tail:
            self.saw_data = True
        return tail

    @property
    def pending(self) -> int:
        """Bytes held back (an incomplete event)."""
        return len(self._tail)

    def _read_usage(self, events: bytes) -> None:
        """Parse the last line that mentions usage (only the last report counts)."""
        at = events.rfind(b'"usage"')
        start = max(events.rfind(b"\n", 0, at), events.rfind(b"\r", 0, at)) + 1
        end = len(events)
        for sep in (b"\n", b"\r"):
            i = events.find(sep, at)
            if 0 <= i < end:
                end = i
        line = events[start:end]
        if not line.startswith(b"data:"):
            return
        try:
            usage = usage_of(json.loads(line[5:]))
        except (ValueError, UnicodeDecodeError):
            return
        if usage is not None:
            self.usage = usage


def _last_boundary_end(data: bytes) -> int:
    """Index just past the last event boundary in ``data`` (0 when there is none)."""
    ends = [i + len(sep) for sep in _SEPARATORS if (i := data.rfind(sep)) >= 0]
    return max(ends, default=0)


_SEPARATORS = (b"\n\n", b"\r\n\r\n", b"\r\r")
