"""A stream's ``system_fingerprint`` when the gateway hides the usage event it asked for.

vLLM (0.32: ``--fingerprint-mode full`` by default) stamps ``system_fingerprint`` on every chunk
that carries a ``finish_reason`` when the client did not ask for usage, and only on the closing
usage chunk when it did (``openai/chat_completion/serving.py``, ``openai/completion/serving.py``).
The gateway asks on the client's behalf and keeps that usage chunk from it (``_usage``), which
took the fingerprint with it: the client got a stream without one. So while usage is hidden, the
chunks that carry a ``finish_reason`` are held until the usage chunk comes (vLLM sends it right
after the last of them) and go out with its fingerprint, as vLLM sends them to a client that did
not ask; a usage chunk without one (SGLang, older vLLMs) lets them go as they came. Other chunks
are not held: a choice still generating (``n`` > 1) is not kept waiting by another's end, and
each choice's own chunks keep their order.

The fingerprint goes in as the first key of the chunk's JSON, so the rest of its bytes go out as
the replica wrote them (nothing re-encoded); a chunk that has a ``system_fingerprint`` of its own
keeps it.
"""

from __future__ import annotations

import json
import re

# A finish_reason with a value (vLLM leaves out null fields; others write them as null).
_FINISH = re.compile(rb'"finish_reason"\s*:\s*"')
_DATA_OBJECT = re.compile(rb"(^|[\r\n])data: ?\{")  # where a data line's JSON object opens


def finishes(event: bytes) -> bool:
    """Whether ``event`` is a chunk that carries a ``finish_reason`` (one to hold)."""
    return _FINISH.search(event) is not None


def stamped(events: list[bytes], fingerprint: object) -> bytes:
    """``events`` (each with its boundary) joined, each with ``fingerprint`` as the first key of
    its data object where it is a string and the event has none (module docstring)."""
    if not isinstance(fingerprint, str) or not fingerprint:
        return b"".join(events)
    key = b'"system_fingerprint":' + json.dumps(fingerprint).encode() + b","
    out = []
    for event in events:
        opened = _DATA_OBJECT.search(event)
        if opened is not None and b'"system_fingerprint"' not in event:
            at = opened.end()
            empty = event[at:].lstrip()[:1] == b"}"  # (no chunk is; an object must stay one)
            event = event[:at] + (key[:-1] if empty else key) + event[at:]
        out.append(event)
    return b"".join(out)
