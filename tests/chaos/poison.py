"""Poison requests: bodies that have crashed or confused a gateway or its replicas.

Each kind is a list of variants, ``(body bytes, extra headers)``, all aimed at
``POST /v1/chat/completions``. A healthy gateway answers every one with a 200 or a JSON 4xx,
and none of them may take a replica out of rotation: the fault is the request's, not the
replica's. Known history: a gzip body sent with ``Content-Encoding: gzip`` was decompressed by
the gateway and forwarded with the header still on, so replicas answered 500 and were blamed.
Python's ``json`` accepts ``NaN``/``Infinity``, lone surrogate escapes and UTF-16/32 bodies,
where other parsers (msgspec, vLLM's pydantic) may not: the gateway and the replica must not
disagree about what a body says.
"""

from __future__ import annotations

import gzip
import json
import zlib
from typing import Any

from .clients import MODEL

Variant = tuple[bytes, dict[str, str]]


def _chat(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "poison"}],
        "max_tokens": 4,
    }
    body.update(fields)
    return body


def _js(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def _raw(text: str) -> Variant:
    return text.encode(), {}


GOOD = _js(_chat())
STREAM = _js(_chat(stream=True))
MSG = '"messages":[{"role":"user","content":"%s"}]'


def _nested(depth: int, open_: str, close: str) -> bytes:
    head = '{"model":"' + MODEL + '","messages":[{"role":"user","content":'
    return (head + open_ * depth + close * depth + "}]}").encode()


KINDS: dict[str, list[Variant]] = {
    "gzip": [
        (gzip.compress(GOOD), {"Content-Encoding": "gzip"}),
        (gzip.compress(STREAM), {"Content-Encoding": "gzip"}),
        (zlib.compress(GOOD), {"Content-Encoding": "deflate"}),
        (GOOD, {"Content-Encoding": "gzip"}),  # says gzip, is not
    ],
    "invalid_utf8": [
        (b'{"model":"emulated",' + (MSG % "bad \xff\xfe byte").encode("latin-1") + b"}", {}),
        (b'{"model":"emulated",' + (MSG % "cut \xe2\x82").encode("latin-1") + b"}", {}),
        (b'{"model":"emulated\xc0\xaf",' + (MSG % "x").encode() + b"}", {}),
        (b"\xff" + GOOD, {}),
    ],
    "lone_surrogate": [
        _raw('{"model":"emulated",' + MSG % "\\ud800" + "}"),
        _raw('{"model":"emulated",' + MSG % "tail \\udfff" + "}"),
        _raw('{"model":"emulated",' + MSG % "\\ud800\\u0041" + ',"stream":true}'),
        _raw('{"model":"emulated\\ud800",' + MSG % "x" + "}"),
    ],
    "utf16": [
        (json.dumps(_chat()).encode("utf-16"), {}),
        (json.dumps(_chat()).encode("utf-16-le"), {}),
        (json.dumps(_chat(stream=True)).encode("utf-16-be"), {}),
        (json.dumps(_chat()).encode("utf-32"), {}),
    ],
    "duplicate_keys": [
        _raw('{"model":"emulated",' + MSG % "a" + ',"stream":false,"stream":true}'),
        _raw('{"model":"emulated",' + MSG % "a" + ',"stream":true,"stream":false}'),
        _raw('{"model":"emulated",' + MSG % "a" + "," + MSG % "b" + ',"max_tokens":2}'),
        _raw('{"model":"other","model":"emulated",' + MSG % "a" + ',"max_tokens":2}'),
        _raw('{"model":"emulated",' + MSG % "a" + ',"max_tokens":2,"max_tokens":"x"}'),
    ],
    "deep_nesting": [
        (_nested(100_000, "[", "]"), {}),
        (_nested(20_000, '{"a":', "}"), {}),
        (b"[" * 200_000 + b"]" * 200_000, {}),
        (_nested(1_000, "[", "]"), {}),
    ],
    "huge_max_tokens": [
        (_js(_chat(max_tokens=10**9)), {}),
        (_js(_chat(max_tokens=2**63)), {}),
        (_js(_chat(max_tokens=10**30, stream=True)), {}),
        (_js(_chat(max_tokens=1e308)), {}),
        _raw('{"model":"emulated",' + MSG % "a" + ',"max_tokens":1e999}'),
        _raw('{"model":"emulated",' + MSG % "a" + ',"max_tokens":Infinity}'),
        (_js(_chat(max_tokens=131072)), {}),
    ],
    "wrong_types": [
        (_js(_chat(messages="hello")), {}),
        (_js(_chat(messages=["hello"])), {}),
        (_js(_chat(messages=[{"role": 1, "content": {"x": 1}}])), {}),
        (_js(_chat(max_tokens="100")), {}),
        (_js(_chat(stream="yes")), {}),
        (_js(_chat(model=123)), {}),
        (_js(_chat(temperature="hot", n="2", stop=5)), {}),
        (_js([_chat()]), {}),
        (b"null", {}),
        (_js(_chat(max_tokens=True, stream=1)), {}),
    ],
    "empty_messages": [
        (_js(_chat(messages=[])), {}),
        (_js(_chat(messages=[], stream=True)), {}),
        (_js({"messages": []}), {}),
    ],
}
