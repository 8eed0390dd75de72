"""What the picker reads of a replica's answer, chunk by chunk: its first token and its usage.

The gateway relay's reading (``gateway._proxy``), for an answer that reaches the picker as
ext_proc body messages. An event stream goes through an ``SSEScanner``: its first event with
output is the first token, and its last ``usage`` is kept, and held back from the client when
the picker asked for it. A compressed stream cannot be read: its first chunk stands for the
first token. A plain answer is kept (up to ``MAX_PLAIN_BODY``) to read its usage at the end.
"""

from __future__ import annotations

from prefixroute.gateway import (
    SSEScanner,
    Usage,
    answer_in_body,
    busy_answer,
    is_event_stream_type,
    refuses_stream_options,
    window_said,
)

MAX_PLAIN_BODY = 1024 * 1024  # bytes of a plain answer kept to read its usage (the rest passes)


class AnswerReader:
    def __init__(
        self, content_type: str, compressed: bool, hide_usage: bool, responses: bool = False
    ) -> None:
        """``hide_usage``: the picker asked for the stream's usage, so its event is kept back;
        ``responses``: a Responses API answer, whose id is read (``response_id``)."""
        stream = is_event_stream_type(content_type)
        self.scanner = SSEScanner(hide_usage, responses) if stream and not compressed else None
        self.raw_stream = stream and compressed  # unreadable: its first chunk is the first token
        self._plain: list[bytes] = []
        self._plain_bytes = 0
        self._whole: tuple[Usage | None, str | None] | None = None  # its usage and id, parsed

    @property
    def edits(self) -> bool:
        """What goes on to the client may differ from what came (the usage event kept back)."""
        return self.scanner is not None and self.scanner.hide_usage

    def feed(self, chunk: bytes, end: bool) -> tuple[bytes, bool]:
        """Read ``chunk`` (``end``: the answer's last): what goes on to the client, and whether
        output has come by now."""
        scanner = self.scanner
        if scanner is not None:
            ready = scanner.feed(chunk)
            if end:
                ready += scanner.flush()
            return (ready if scanner.hide_usage else chunk), scanner.saw_data
        if self.raw_stream:
            return chunk, bool(chunk)
        if self._plain_bytes < MAX_PLAIN_BODY:
            self._plain.append(chunk)
            self._plain_bytes += len(chunk)
        return chunk, False

    @property
    def error_status(self) -> int | None:
        """The code of an error the stream reported in-band (``gateway._sse``), or None."""
        return self.scanner.error_status if self.scanner is not None else None

    def busy(self, status: int) -> bool:
        """Whether the answer (of ``status``) is a full replica's: a 429, or SGLang's queue-full
        words in its body or its stream's first in-band error (``gateway._upstream_answers``)."""
        scanner = self.scanner
        if scanner is not None:
            return scanner.error_status is not None and busy_answer(
                scanner.error_status, scanner.error_event)  # fmt: skip
        return status >= 400 and busy_answer(status, b"".join(self._plain))

    def usage(self) -> Usage | None:
        """The answer's usage, once it ended; None where it had none (or could not be read)."""
        if self.scanner is not None:
            self.scanner.flush()
            return self.scanner.usage
        return self._answer()[0]

    def response_id(self, ended: bool) -> str | None:
        """The id of the Responses answer read so far: a stream's from ``response.created``, a
        plain one's from its body once ``ended`` (None: not known, or not such an answer)."""
        if self.scanner is not None:
            return self.scanner.response_id
        return self._answer()[1] if ended else None

    def _answer(self) -> tuple[Usage | None, str | None]:
        """A plain answer's usage and Responses id, parsed once, at its end."""
        if self._whole is None:
            self._whole = answer_in_body(b"".join(self._plain)) if self._plain else (None, None)
        return self._whole

    def refused_stream_options(self) -> bool:
        """A plain 400 that says the replica does not take ``stream_options``."""
        return refuses_stream_options(b"".join(self._plain))

    def window_said(self) -> int | None:
        """The context window a plain 400 says the prompt is over, tokens (None: it does not
        say that; ``gateway._context_window``)."""
        return window_said(b"".join(self._plain)) if self._plain else None
