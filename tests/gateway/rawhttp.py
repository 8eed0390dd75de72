"""HTTP/1.1 by hand, for tests that must send what no client library would: one request on a
fresh ``Connection: close`` socket, the answer read to EOF within a bound, and its head split."""

from __future__ import annotations

import contextlib
import socket
import time


def exchange(
    port: int,
    method: bytes,
    target: bytes,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
    *,
    timeout: float,
    content_length: bool = True,
) -> bytes:
    """Send exactly ``target`` as the request target; every byte of the answer, read to EOF
    (an AssertionError when none comes within ``timeout`` seconds)."""
    head = [method + b" " + target + b" HTTP/1.1", b"Host: 127.0.0.1", b"Connection: close"]
    head += [k + b": " + v for k, v in headers]
    if content_length:
        head.append(b"Content-Length: " + str(len(body)).encode())
    data = b"\r\n".join(head) + b"\r\n\r\n" + body
    deadline = time.monotonic() + timeout
    chunks: list[bytes] = []
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(data)  # the server may answer (413) and close before it has it all
        while True:
            s.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                raise AssertionError(f"no answer to {target!r} within {timeout} s") from None
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def split_answer(raw: bytes) -> tuple[int | None, dict[str, str], bytes]:
    """The final answer's status (None when the server closed without one), its headers
    (names lower-cased) and its body as sent; an interim answer (100 Continue) is skipped."""
    while raw.startswith(b"HTTP/1.1 1"):
        raw = raw.partition(b"\r\n\r\n")[2]
    if not raw.startswith(b"HTTP/1."):
        return None, {}, raw
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(lines[0].split(" ")[1]), headers, body
