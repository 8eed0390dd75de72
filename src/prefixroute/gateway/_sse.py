"""Watching a relayed server-sent-event stream without re-encoding it.

:class:`SSEScanner` sits between the upstream and the client. Each chunk the upstream sends goes
out at once, cut only at the last event boundary inside it: a client never holds half an event
when the upstream dies, so the gateway can always end the stream with a clean error event.
Upstreams (vLLM, SGLang, the emulator) write whole events per chunk, so the cut delays nothing
in practice; an event split across chunks waits only for its own end.

While relaying it notes the first event that carries output (the first token, for the load view and
the speed model) and the ``cached_tokens`` of any event carrying ``usage`` (the final chunk, with
vLLM; a Responses stream's ``response.completed``) or SGLang's ``meta_info`` (every chunk of a
``/generate`` stream: the last one is parsed, once, when the usage is read). A chat stream's
opening chunk with only the assistant's role is not the first token: vLLM and SGLang send it with
the first token, but servers written otherwise send it when the stream opens, before any prefill,
and every first token they served read as instant. Nor is a Responses stream's opening
(``response.created``, ``response.in_progress``, an item or a part added): its first token is its
first ``*.delta`` event, and its id (from ``response.created``) is noted. An Anthropic Messages
stream's first token is its first ``content_block_delta`` (``message_start``, a block's start,
``ping`` come before any), and its usage comes in ``message_start`` and ``message_delta``.
Events are parsed as JSON until the first token and when they mention ``"usage"``; the rest is a
byte search.

An event that reports an error in-band (``{"error": {...}}``, or vLLM's older ``{"object":
"error", ...}``: what vLLM and SGLang send when a request fails after its stream started) is not
output: ``error_status`` keeps its code (500 when it names none; a Responses stream's ``error``
and ``response.failed`` events too), so the request teaches no first token and its replica is
judged by it (``_verdict``), where a healthy 200 was counted before and a replica failing every
request in-band was learned as the fastest of its fleet.

With ``hide_usage`` (the gateway asked for the usage the client did not,
:func:`~prefixroute.gateway._usage.ask_for_stream_usage`) a usage-only event is read and not
relayed, and the chunks that carry a ``finish_reason`` wait for it, to take its
``system_fingerprint`` (``_fingerprint``); every other event goes out as it came.
"""

from __future__ import annotations

import json
import re

from prefixroute._usage_counts import Usage, merged, usage_of
from prefixroute.gateway._fingerprint import finishes, stamped
from prefixroute.gateway._usage import is_usage_only


def is_event_stream_type(content_type: str) -> bool:
    """A Content-Type of server-sent events: a media type is case-insensitive (RFC 9110
    8.3.1), and ``Text/Event-Stream`` from a replica was buffered whole as a plain answer."""
    return content_type.lstrip().lower().startswith("text/event-stream")


def only_comments(events: bytes) -> bool:
    """Whether complete ``events`` hold nothing but SSE comments (lines that start with ``:``,
    the keep-alives some servers send while a request waits: ``: ping``)."""
    return all(not line or line.startswith(b":") for line in _LINES.split(events))


class SSEScanner:
    def __init__(self, hide_usage: bool = False, responses: bool = False) -> None:
        # Bytes after the last complete event, in the pieces they came in, and their last 3
        # bytes (where a boundary that ends in the next chunk may begin).
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._edge = b""
        self.saw_data = False  # a data event went by (the first token)
        self._usage: Usage | None = None  # the last usage-bearing event's
        # The last event with SGLang's meta_info (every /generate chunk has one): parsed only
        # when the usage is read, not once per token.
        self._meta_line: bytes | None = None
        self.hide_usage = hide_usage  # keep usage-only events from the client (module doc)
        self._finished: list[bytes] = []  # with hide_usage: finish chunks held (_fingerprint)
        self.error_status: int | None = None  # the first in-band error event's code (module doc)
        self.error_event = b""  # and that event, as it came (what it says: _upstream_answers)
        # A Responses API stream: its id (from response.created) and its response.failed
        # are watched for; other streams pay no search for them.
        self.responses = responses
        self.response_id: str | None = None

    @property
    def usage(self) -> Usage | None:
        """The usage of the last event that carried one (``usage``, or ``meta_info``)."""
        if self._meta_line is not None:
            line, self._meta_line = self._meta_line, None
            usage = _usage_in_line(line)
            if usage is not None:
                self._usage = usage
        return self._usage

    @property
    def cached_tokens(self) -> int | None:
        """``usage.prompt_tokens_details.cached_tokens`` of the last usage-bearing event."""
        return self.usage.cached_tokens if self.usage is not None else None

    def feed(self, chunk: bytes) -> bytes:
        """The complete events that ``chunk`` finishes; the rest waits for the next chunk."""
        if self._held:  # search the new bytes only: an event sent in many chunks was
            joint = self._edge + chunk  # searched whole at each one, O(n^2) in its size
            found = _last_boundary_end(joint)
            if found == 0:
                self._hold(chunk)
                return b""
            data = b"".join(self._held) + chunk
            end = len(data) - len(joint) + found
            self._held, self._held_bytes, self._edge = [], 0, b""
        else:
            data, end = chunk, _last_boundary_end(chunk)
            if end == 0:
                self._hold(chunk)
                return b""
        ready = data[:end]
        if end < len(data):
            self._hold(data[end:])
        if self.hide_usage and (b'"usage"' in ready or self._finished or finishes(ready)):
            ready = self._take_usage(ready)
        elif b'"usage"' in ready:
            self._read_usage(ready)
        elif b'"meta_info"' in ready:
            self._meta_line = _last_line(ready, b'"meta_info"')
        self._scan(ready)
        return ready

    def flush(self) -> bytes:
        """What is left when the upstream ends cleanly (relayed as is, less a usage-only
        event with ``hide_usage``)."""
        tail = b"".join(self._held)
        self._held, self._held_bytes, self._edge = [], 0, b""
        if self.hide_usage and (b'"usage"' in tail or self._finished or finishes(tail)):
            tail = self._take_usage(tail)
            tail = self.release() + tail  # no usage event came: the held chunks as they came
        elif b'"meta_info"' in tail:
            self._meta_line = _last_line(tail, b'"meta_info"')
        self._scan(tail)
        return tail

    def release(self) -> bytes:
        """The finish chunks held for a usage event's fingerprint, as they came (the stream
        ends without one: cleanly, or broken, before its error event)."""
        held, self._finished = self._finished, []
        return b"".join(held)

    def _scan(self, events: bytes) -> None:
        """Note the first token and an in-band error among complete ``events``."""
        failed = self.responses and _FAILED in events
        if self.error_status is None and (b'"error"' in events or failed):
            found = first_error_event(events)
            if found is not None:
                self.error_status, self.error_event = found
        if not self.saw_data and b"data:" in events:
            self.saw_data = _carries_output(events)
        if self.responses and self.response_id is None and b'"response.created"' in events:
            self.response_id = _created_id(events)

    @property
    def pending(self) -> int:
        """Bytes held back (an incomplete event)."""
        return self._held_bytes

    def _hold(self, piece: bytes) -> None:
        self._held.append(piece)
        self._held_bytes += len(piece)
        self._edge = (self._edge + piece)[-3:]

    def _read_usage(self, events: bytes) -> None:
        """Parse the last line that mentions usage (the last report counts, and an earlier
        one only for the counts it leaves out: Anthropic's closing ``message_delta`` may give
        only the output tokens, its ``message_start`` the prompt's)."""
        usage = _usage_in_line(_last_line(events, b'"usage"'))
        if usage is not None:
            self._usage = usage if self._usage is None else merged(usage, self._usage)
            self._meta_line = None

    def _take_usage(self, events: bytes) -> bytes:
        """``events`` less its usage-only events, whose usage is noted, and less the chunks
        with a ``finish_reason``, held until a usage event stamps them with its fingerprint (or
        ``[DONE]`` comes first: as they came)."""
        parts = _BOUNDARY.split(events)  # event, boundary, event, ..., what follows the last
        kept: list[bytes] = []
        for i in range(0, len(parts), 2):
            event, boundary = parts[i], parts[i + 1] if i + 1 < len(parts) else b""
            if b'"usage"' in event and is_usage_only(obj := _data_of(event)):
                self._usage = usage_of(obj)
                mark = obj.get("system_fingerprint") if isinstance(obj, dict) else None
                kept.append(stamped(self._finished, mark))
                self._finished = []
            elif finishes(event):
                self._finished.append(event + boundary)
            else:
                if self._finished and event.strip().endswith(b"[DONE]"):
                    kept.append(self.release())
                kept.append(event + boundary)
        return b"".join(kept)


def _last_line(events: bytes, needle: bytes) -> bytes:
    """The last line of ``events`` that holds ``needle`` (which must be in it)."""
    at = events.rfind(needle)
    start = max(events.rfind(b"\n", 0, at), events.rfind(b"\r", 0, at)) + 1
    end = len(events)
    for sep in (b"\n", b"\r"):
        i = events.find(sep, at)
        if 0 <= i < end:
            end = i
    return events[start:end]


def _usage_in_line(line: bytes) -> Usage | None:
    """The usage of one ``data:`` line, or None (another line, not JSON, no usage)."""
    if not line.startswith(b"data:"):
        return None
    try:
        return usage_of(json.loads(line[5:]))
    except (ValueError, UnicodeDecodeError):
        return None


def _data_of(event: bytes) -> object | None:
    """The JSON of an event's ``data:`` lines (joined as the SSE spec joins them), or None."""
    lines = [line for line in re.split(rb"\r\n|\r|\n", event) if line.startswith(b"data:")]
    if not lines:
        return None
    payload = b"\n".join(line[6:] if line.startswith(b"data: ") else line[5:] for line in lines)
    try:
        obj: object = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return None
    return obj


def _carries_output(events: bytes) -> bool:
    """Whether a data event in ``events`` is more than an opening chunk with nothing generated
    (a role, empty content) or ``[DONE]``. An event that is not such a JSON chunk (an error, a
    format we do not know) counts, as any data event did before."""
    for event in _BOUNDARY.split(events)[::2]:
        if b"data:" not in event:
            continue
        obj = _data_of(event)
        if obj is None:
            if event.strip().endswith(b"[DONE]"):
                continue
            return True
        if not isinstance(obj, dict):
            return True
        if error_status_of(obj) is not None:
            continue  # an error reported in-band is no output (module docstring)
        kind = obj.get("type")
        if kind in _ANTHROPIC_OPENING:  # Anthropic's: the message, a block, a ping, no output
            continue
        if isinstance(kind, str) and kind.startswith("response."):  # the Responses API's
            if kind.endswith(".delta"):  # text, reasoning, a function call's arguments...
                return True
            continue  # created, in_progress, an item or part added: nothing generated yet
        if "choices" not in obj and isinstance(obj.get("meta_info"), dict):
            if _generated_natively(obj):  # SGLang's /generate
                return True
            continue
        if not isinstance(obj.get("choices"), list):
            return True
        if any(_generated(choice) for choice in obj["choices"]):
            return True
    return False


def _created_id(events: bytes) -> str | None:
    """The id of the response that a ``response.created`` event among ``events`` announces."""
    for event in _BOUNDARY.split(events)[::2]:
        if b'"response.created"' in event:
            obj = _data_of(event)
            response = obj.get("response") if isinstance(obj, dict) else None
            rid = response.get("id") if isinstance(response, dict) else None
            if isinstance(rid, str):
                return rid
    return None


def first_error_event(events: bytes) -> tuple[int, bytes] | None:
    """The code and bytes of the first in-band error event among ``events`` (None: none)."""
    for event in _BOUNDARY.split(events)[::2]:
        if b'"error"' in event or _FAILED in event:
            status = error_status_of(_data_of(event))
            if status is not None:
                return status, event
    return None


def error_status_of(obj: object) -> int | None:
    """The HTTP status an event's JSON reports as an error: its ``code`` when that is one
    (400-599), else 500; None when the event is no error report (a chunk with ``choices`` is
    output, whatever it holds)."""
    if not isinstance(obj, dict) or "choices" in obj:
        return None
    kind = obj.get("type")
    if kind == "response.failed":  # the Responses API's failure: no code of HTTP's
        return 500
    if obj.get("object") == "error" or kind == "error":  # (the Responses API's error event)
        detail: object = obj
    elif "error" in obj:
        detail = obj["error"]
    else:
        return None
    code = detail.get("code") if isinstance(detail, dict) else None
    if isinstance(code, str) and code.isdigit():
        code = int(code)
    return code if isinstance(code, int) and 400 <= code <= 599 else 500


def _generated_natively(chunk: dict[str, object]) -> bool:
    """A ``/generate`` chunk with output: text, token ids, or a completion token counted (a
    token that ends inside a UTF-8 character arrives with no text yet, but it was made)."""
    meta = chunk["meta_info"]
    assert isinstance(meta, dict)
    done = meta.get("completion_tokens")
    made = isinstance(done, int) and not isinstance(done, bool) and done > 0
    return bool(chunk.get("text") or chunk.get("output_ids") or made)


def _generated(choice: object) -> bool:
    """A choice with output in it: text, or a delta with anything but its role."""
    if not isinstance(choice, dict):
        return True
    if choice.get("text"):
        return True
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return any(v for k, v in delta.items() if k != "role")
    return "text" not in choice  # a shape we do not know counts; an empty text does not


def _last_boundary_end(data: bytes) -> int:
    """Index just past the last event boundary in ``data`` (0 when there is none)."""
    ends = [i + len(sep) for sep in _SEPARATORS if (i := data.rfind(sep)) >= 0]
    return max(ends, default=0)


_SEPARATORS = (b"\n\n", b"\r\n\r\n", b"\r\r")
_FAILED = b'"response.failed"'  # a Responses stream's failure (its error may be null)
# An Anthropic Messages stream's events before and around its output (a content_block_delta is
# output; these never are: a block's start holds no generated text, not even a tool's input).
_ANTHROPIC_OPENING = frozenset(
    {"message_start", "content_block_start", "ping", "content_block_stop", "message_delta",
     "message_stop"}
)  # fmt: skip
_BOUNDARY = re.compile(rb"(\r\n\r\n|\n\n|\r\r)")
_LINES = re.compile(rb"\r\n|\r|\n")
