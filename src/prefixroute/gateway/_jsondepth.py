"""A nesting limit for request bodies.

Python's JSON decoder and encoder recurse once per level, against the interpreter's recursion
limit less the stack already in use, so a body nested a few hundred levels deep can parse here
and fail later: in a re-encode, or in a replica whose stack is deeper when it parses. The fuzz
suite found exactly that: 977 levels passed the gateway and made the replica answer 500, and
those 500s took healthy replicas out of rotation. OpenAI request bodies nest a few levels (tool
schemas a few dozen at most), so anything past ``MAX_DEPTH`` is refused as invalid JSON.
"""

from __future__ import annotations

from collections.abc import Iterable

MAX_DEPTH = 64  # nesting levels of arrays and objects a request body may have


def too_deep(body: bytes, obj: object, limit: int = MAX_DEPTH) -> bool:
    """Whether ``obj`` (parsed from ``body``) nests arrays/objects more than ``limit`` deep."""
    if body.count(b"[") + body.count(b"{") <= limit:  # C-speed answer for almost every body
        return False
    stack: list[tuple[object, int]] = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(node, dict):
            children: Iterable[object] = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False
