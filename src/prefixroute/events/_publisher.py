"""Publishing KV-event batches the way vLLM's ``ZmqEventPublisher`` does (for emulated engines).

Same frames (topic, 8-byte big-endian sequence from 0, msgpack ``KVEventBatch``), same socket
types (PUB; ROUTER for replay), same replay protocol: a DEALER client sends the first sequence
number it wants, and gets every buffered ``[topic, seq, payload]`` from there, then
``[b"", -1, b""]`` (vLLM 0.32's frames, checked against a real engine's replay socket). The
endpoint is seen from the publisher's side: ``bind:`` means we bind.

``positional=True`` sends each event as an array, as SGLang's publisher and vLLM's before its
events became maps do (``_wire_other``), to emulate such an engine.

``publish`` never blocks: a PUB socket drops messages nobody is connected to receive, or that
exceed the high-water mark, which is exactly what the subscriber's gap handling is for.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Sequence

import zmq
import zmq.asyncio

from prefixroute._tasks import cancel_and_wait
from prefixroute.events._endpoint import EventEndpoint, is_ipv6
from prefixroute.events._errors import BadEndpoint
from prefixroute.events._wire import (
    END_SEQ,
    KVEvent,
    KVEventBatch,
    encode_batch,
    pack_frames,
)
from prefixroute.events._wire_other import encode_array_batch

log = logging.getLogger(__name__)

BUFFER_STEPS = 10_000  # batches kept for replay (vLLM's default buffer_steps)
SND_HWM = 100_000  # vLLM's default high-water mark


class EventPublisher:
    """One engine's KV-event publisher: PUB socket, optional replay ROUTER socket."""

    def __init__(
        self,
        endpoint: EventEndpoint,
        context: zmq.asyncio.Context | None = None,
        *,
        buffer_steps: int = BUFFER_STEPS,
        positional: bool = False,
    ) -> None:
        self.endpoint = endpoint
        self.positional = positional  # each event an array, as SGLang sends (``_wire_other``)
        self.context = context  # None: the publisher makes its own at start, terms it at stop
        self._owns_context = context is None
        self.address: str | None = None  # bound or connected address, once started
        self.replay_address: str | None = None  # bound replay address, once started
        self.published = 0  # batches handed to the socket (or dropped on purpose)
        self._topic = endpoint.topic.encode()
        self._seq = itertools.count()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._pub: zmq.Socket[bytes] | None = None
        self._router: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._pub is not None:
            return
        if self.context is None:
            self.context = zmq.asyncio.Context()
        # PUB sends never block, so a plain socket on the same context serves the event loop.
        pub: zmq.Socket[bytes] = zmq.Context.shadow(self.context.underlying).socket(zmq.PUB)
        pub.setsockopt(zmq.SNDHWM, SND_HWM)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.IPV6, int(is_ipv6(self.endpoint.address)))
        try:
            if self.endpoint.bind:
                pub.bind(self.endpoint.address)
                self.address = _last_endpoint(pub)
            else:
                pub.connect(self.endpoint.address)
                self.address = self.endpoint.address
            if self.endpoint.replay is not None:
                router = self.context.socket(zmq.ROUTER)
                router.setsockopt(zmq.LINGER, 0)
                router.setsockopt(zmq.IPV6, int(is_ipv6(self.endpoint.replay)))
                self._router = router
                router.bind(self.endpoint.replay)
                self.replay_address = _last_endpoint(router)
        except zmq.ZMQError as exc:
            pub.close(linger=0)
            await self.stop()
            raise BadEndpoint(f"cannot open KV-event endpoint {self.endpoint}: {exc}") from exc
        self._pub = pub
        if self._router is not None:
            self._task = asyncio.get_running_loop().create_task(
                self._serve_replay(self._router), name="kv-events replay"
            )

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
        for sock in (self._pub, self._router):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._router = None
        if self._owns_context and self.context is not None:
            self.context.term()
            self.context = None

    def publish(
        self, events: Sequence[KVEvent], ts: float | None = None, *, drop: bool = False
    ) -> int:
        """Send one batch; returns its sequence number.

        ``drop`` numbers and buffers the batch without sending it, as a PUB socket that drops a
        message would (for fault tests: the subscriber sees a gap the replay can close).
        """
        if self._pub is None:
            raise RuntimeError("the KV-event publisher is not started")
        seq = next(self._seq)
        ts = time.time() if ts is None else ts
        if self.positional:
            payload = encode_array_batch(ts, list(events))
        else:
            payload = encode_batch(KVEventBatch(ts, list(events)))
        self._buffer.append((seq, payload))
        if not drop:
            self._pub.send_multipart(pack_frames(self._topic, seq, payload), flags=zmq.NOBLOCK)
        self.published += 1
        return seq

    async def _serve_replay(self, router: zmq.asyncio.Socket) -> None:
        while True:
            frames = await router.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                log.warning("invalid KV-event replay request (%d frames)", len(frames))
                continue
            client, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):
                if seq >= first:
                    reply = [client, b"", self._topic, seq.to_bytes(8, "big"), payload]
                    await router.send_multipart(reply)
            end = END_SEQ.to_bytes(8, "big", signed=True)
            await router.send_multipart([client, b"", b"", end, b""])


def _last_endpoint(sock: zmq.Socket[bytes] | zmq.asyncio.Socket) -> str:
    last = sock.getsockopt(zmq.LAST_ENDPOINT)
    return last.decode() if isinstance(last, bytes) else str(last)
