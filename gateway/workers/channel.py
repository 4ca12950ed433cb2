"""The control channel: one Unix stream socket between the control process and each worker.

Frames are a 4-byte big-endian length and an orjson object. The worker asks, the control
process answers, one exchange at a time per connection:

- ``{"op": "hello", "worker": K, "pid": P}`` -> ``{}``: who is on this connection;
- ``{"op": "push", "snapshot": S}`` -> ``{}``: the worker's metrics now (about once a second, and
  when it stops);
- ``{"op": "scrape", "snapshot": S}`` -> ``{"text": "..."}``: the worker's metrics now, answered
  with the whole gateway's merged exposition (what any worker's ``/metrics`` returns).

When a connection ends the control process treats that worker as gone (its counters are kept).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from typing import Any

import orjson

from gateway.workers.merge import snapshot

__all__ = ["ControlClient", "read_frame", "write_frame"]

log = logging.getLogger("gateway.workers")

_MAX_FRAME = 64 * 1024 * 1024  # a snapshot of every series of a large gateway stays far below this
PUSH_INTERVAL = 1.0


async def read_frame(reader: asyncio.StreamReader) -> dict[str, Any]:
    head = await reader.readexactly(4)
    size = int.from_bytes(head, "big")
    if size > _MAX_FRAME:
        raise ValueError(f"control frame of {size} bytes")
    body = orjson.loads(await reader.readexactly(size))
    if not isinstance(body, dict):
        raise ValueError("control frame is not an object")
    return body


def write_frame(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    body = orjson.dumps(message)
    writer.write(len(body).to_bytes(4, "big") + body)


class ControlClient:
    """A worker's end: pushes its metrics and fetches the merged view. One event loop."""

    def __init__(self, path: str, worker: int, registry: Any) -> None:
        self._path = path
        self._worker = worker
        self._registry = registry
        self._lock = asyncio.Lock()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pusher: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._reader, self._writer = await asyncio.open_unix_connection(self._path)
        await self._ask({"op": "hello", "worker": self._worker, "pid": os.getpid()})
        self._pusher = asyncio.create_task(self._push_loop())

    async def _ask(self, message: dict[str, Any]) -> dict[str, Any]:
        async with self._lock:  # one exchange at a time: answers come back in order
            assert self._reader is not None and self._writer is not None
            write_frame(self._writer, message)
            await self._writer.drain()
            return await read_frame(self._reader)

    async def _push_loop(self) -> None:
        while True:
            await asyncio.sleep(PUSH_INTERVAL)
            try:
                await self._ask({"op": "push", "snapshot": snapshot(self._registry)})
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                # The control process is gone (PDEATHSIG covers most cases; this covers the rest):
                # a worker without its gateway drains and exits rather than serving on alone.
                log.warning("control channel lost (%s): draining", exc)
                os.kill(os.getpid(), signal.SIGTERM)
                return

    async def scrape(self) -> bytes:
        """The whole gateway's metrics in Prometheus' text format."""
        answer = await self._ask({"op": "scrape", "snapshot": snapshot(self._registry)})
        text = answer.get("text")
        return text.encode() if isinstance(text, str) else b""

    async def close(self) -> None:
        """Push the last values (so nothing this worker counted is lost), then hang up."""
        if self._pusher is not None:
            self._pusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pusher
        if self._writer is None:
            return
        try:
            await asyncio.wait_for(self._ask({"op": "push", "snapshot": snapshot(self._registry)}), 2.0)
        except (OSError, asyncio.IncompleteReadError, ValueError, TimeoutError):
            pass
        self._writer.close()
