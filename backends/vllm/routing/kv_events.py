"""Which KV-cache blocks each vLLM server holds, learned from the server's own KV events.

vLLM started with ``--kv-events-config`` publishes, over a ZMQ PUB socket, multipart messages
``(topic, sequence number as 8 big-endian bytes, msgpack payload)``; the payload is
``[timestamp, [event, ...], data_parallel_rank]``, each event a map tagged by ``type``:
``BlockStored`` (``block_hashes``, ``parent_block_hash``, ``token_ids``, ``block_size``, ``medium``),
``BlockRemoved`` (``block_hashes``, ``medium``), ``AllBlocksCleared``.

- :class:`BlockIndex`: one server's block keys (``backends.vllm.routing.blocks.event_key``), at most
  ``capacity`` (the oldest stored dropped first), so memory is bounded whatever the server says;
  emptied by ``AllBlocksCleared``, by a new process behind the endpoint (a new generation), and by a
  publisher whose sequence numbers start again (it restarted). Only GPU blocks count (events of
  an offloading tier name another ``medium``).
- :class:`KVEventFeeds`: one subscriber task per endpoint of a backend, started, moved and stopped
  by :meth:`KVEventFeeds.sync` as the endpoints change; each process that routes runs its own
  (ZMQ fans a PUB socket out to every subscriber, so every gateway worker and replica sees the
  same events). Needs ``pyzmq`` and ``msgspec`` (``completions-gateway[kv-events]``); without
  them :meth:`KVEventFeeds.sync` says why and nothing runs.

A gap in the sequence numbers (the publisher's high-water mark dropped messages) is counted: the
index may then keep a block the server evicted until the capacity pushes it out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from backends.vllm.routing.blocks import event_key

__all__ = ["BlockIndex", "HasBlocks", "KVEventFeeds", "apply_batch", "missing_libraries"]

log = logging.getLogger("gateway.pool")

_GPU = (None, "GPU", "gpu")


class BlockIndex:
    """At most ``capacity`` block keys of one server. Not thread-safe (one event loop)."""

    __slots__ = ("_keys", "capacity", "events", "gaps", "last_seq")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._keys: OrderedDict[int, None] = OrderedDict()
        self.last_seq: int | None = None
        self.events = 0
        self.gaps = 0

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: int) -> bool:
        return key in self._keys

    def run(self, keys: Sequence[int]) -> int:
        """How many of ``keys``, from the first on, the server holds (its prefix-cache hit, in blocks)."""
        held = self._keys
        n = 0
        for key in keys:
            if key not in held:
                break
            n += 1
        return n

    def store(self, keys: Iterable[int]) -> None:
        held = self._keys
        for key in keys:
            if key in held:
                held.move_to_end(key)
            else:
                held[key] = None
        while len(held) > self.capacity:
            held.popitem(last=False)

    def remove(self, keys: Iterable[int]) -> None:
        held = self._keys
        for key in keys:
            held.pop(key, None)

    def clear(self) -> None:
        self._keys.clear()
        self.last_seq = None


def _keys(values: object) -> list[int]:
    if not isinstance(values, list):
        return []
    return [k for k in map(event_key, values) if k is not None]


def apply_batch(index: BlockIndex, seq: int, payload: Any) -> None:
    """Apply one decoded message (sequence number ``seq``, payload ``[ts, events, rank]``) to ``index``."""
    last = index.last_seq
    if last is not None and seq <= last:  # numbering started again: a new publisher, a new cache
        index.clear()
    elif last is not None and seq != last + 1:
        index.gaps += 1
    index.last_seq = seq
    if not isinstance(payload, list | tuple) or len(payload) < 2 or not isinstance(payload[1], list):
        return
    for event in payload[1]:
        if not isinstance(event, dict):
            continue
        index.events += 1
        kind = event.get("type")
        if kind == "BlockStored" and event.get("medium") in _GPU:
            index.store(_keys(event.get("block_hashes")))
        elif kind == "BlockRemoved" and event.get("medium") in _GPU:
            index.remove(_keys(event.get("block_hashes")))
        elif kind == "AllBlocksCleared":
            index.clear()
            index.last_seq = seq


def missing_libraries() -> str | None:
    """Why KV events cannot be read here (a library missing), or None."""
    try:
        import msgspec  # noqa: F401
        import zmq  # noqa: F401
    except ImportError as exc:
        return f"{exc.name} is not installed (pip install 'completions-gateway[kv-events]')"
    return None


class HasBlocks(Protocol):
    """An endpoint as the feeds see it (``backends.vllm.routing.balancer.Endpoint``)."""

    index: int
    generation: int
    blocks: BlockIndex


class KVEventFeeds:
    """A backend's subscriptions: one task per endpoint, reading into the endpoint's :class:`BlockIndex`."""

    def __init__(self, name: str, topic: str) -> None:
        self.name = name
        self.topic = topic.encode()
        # endpoint index -> (address, generation, task)
        self._tasks: dict[int, tuple[str, int, asyncio.Task[None]]] = {}
        self._ctx: Any = None
        self.problem = missing_libraries()

    def sync(self, endpoints: Iterable[HasBlocks], address: Callable[[HasBlocks], str | None]) -> None:
        """Subscribe to each endpoint's publisher (``address``; None: none), once per process behind it."""
        if self.problem is not None:
            return
        wanted: dict[int, tuple[str, int, HasBlocks]] = {}
        for ep in endpoints:
            where = address(ep)
            if where and ep.generation > 0:
                wanted[ep.index] = (where, ep.generation, ep)
        for index in [i for i in self._tasks if i not in wanted]:
            self._tasks.pop(index)[2].cancel()
        for index, (where, generation, ep) in wanted.items():
            running = self._tasks.get(index)
            if running is not None and running[:2] == (where, generation):
                continue
            if running is not None:
                running[2].cancel()
            ep.blocks.clear()  # a new process behind the endpoint: its cache starts empty
            task = asyncio.create_task(self._follow(where, ep.blocks), name=f"{self.name} kv events {index}")
            self._tasks[index] = (where, generation, task)

    async def _follow(self, address: str, index: BlockIndex) -> None:
        import msgspec
        import zmq
        import zmq.asyncio

        if self._ctx is None:
            self._ctx = zmq.asyncio.Context()
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, self.topic)
        decode = msgspec.msgpack.Decoder().decode
        try:
            sock.connect(address)
            log.info("backend %s: reading KV events from %s", self.name, address)
            while True:
                frames = await sock.recv_multipart()
                if len(frames) != 3:
                    continue
                try:
                    apply_batch(index, int.from_bytes(frames[1], "big", signed=True), decode(frames[2]))
                except (msgspec.DecodeError, ValueError) as exc:
                    log.warning("backend %s: unreadable KV event from %s: %s", self.name, address, exc)
        except zmq.ZMQError as exc:
            log.warning("backend %s: KV events from %s: %s", self.name, address, exc)
        finally:
            sock.close(linger=0)

    async def close(self) -> None:
        tasks = [t for _, _, t in self._tasks.values()]
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
