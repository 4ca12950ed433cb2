"""The shared backends of ``gateway serve --workers N``: owned by the control process, routed by the workers.

The control process runs each ``vllm-pool`` once (``backends.vllm.pool.shared.PoolOwnership``:
supervisor, launcher, probes, scrapes, version detection, ``status.json``), started before the
first worker and stopped after the last one drained. So exactly the configured vLLM processes
run, a gateway worker that dies leaves them running, and they die with the control process (the
launcher's ``PR_SET_PDEATHSIG`` points at it). A ``vllm`` backend over ``base_urls`` or
``discovery`` is shared the same way: its DNS discovery, probes, scrapes and version detection
run once, in the control process.

This module is the channel between the two ends. A worker opens a second connection to the
control socket with ``{"op": "watch"}`` (:class:`PoolFeed`); the control process
(:class:`PoolWatchers`) answers with the pools' frame at once and again after every change
(a state change, each metrics scrape); the worker sends ``{"op": "suspect", ...}`` back when a
call could not connect. Why this channel rather than the status file or shared memory: the
views are small, change at most once per scrape interval, and must arrive at once when a vLLM
worker becomes ready or goes away (polling a file trades latency for wake-ups). The one figure
that changes per request, calls in flight, has its shared-memory table instead
(``backends.vllm.pool.inflight``): no message per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from backends.registry import PoolClients, PoolOwnership
from gateway.configfile import ConfigError
from gateway.workers.channel import read_frame, write_frame
from schemas.config import GatewayConfig, VLLMPoolBackendConfig

__all__ = ["PoolFeed", "PoolWatchers", "same_pools"]

log = logging.getLogger("gateway.workers")

_MAX_BACKLOG = 4 * 1024 * 1024  # bytes unsent to one worker before its watch is dropped


class PoolWatchers:
    """The control process's end: every worker's watch connection, told each change of ``owner``."""

    def __init__(self, owner: PoolOwnership) -> None:
        self.owner = owner
        self._watchers: set[asyncio.StreamWriter] = set()
        self._scheduled = False

    async def start(self) -> None:
        await self.owner.start(self._changed)

    async def close(self) -> None:
        for writer in list(self._watchers):
            writer.close()
        await self.owner.close()

    def _changed(self) -> None:
        # Coalesced: every change of one loop turn goes out as one frame.
        if not self._scheduled and self._watchers:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._publish)

    def _publish(self) -> None:
        self._scheduled = False
        frame = self.owner.frame()
        for writer in list(self._watchers):
            transport = writer.transport
            if transport.is_closing() or transport.get_write_buffer_size() > _MAX_BACKLOG:
                self._watchers.discard(writer)  # a stuck worker: it routes on its last view until it dies
                writer.close()
                continue
            write_frame(writer, frame)

    async def watch(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One worker's watch connection, until it ends."""
        self._watchers.add(writer)
        try:
            write_frame(writer, self.owner.frame())
            await writer.drain()
            while True:
                message = await read_frame(reader)
                if message.get("op") == "suspect":
                    self.owner.suspect(message.get("pool"), message.get("index"), message.get("generation"))
        finally:
            self._watchers.discard(writer)


class PoolFeed:
    """A worker's end: applies the control process's frames to its pool clients."""

    def __init__(self, path: str, clients: PoolClients) -> None:
        self._path = path
        self._clients = clients
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Connected, and the first frame applied (so the pools are known before serving)."""
        reader, self._writer = await asyncio.open_unix_connection(self._path)
        self._clients.on_suspect(self._suspect)
        write_frame(self._writer, {"op": "watch"})
        await self._writer.drain()
        self._clients.apply(await read_frame(reader))
        self._task = asyncio.create_task(self._follow(reader))

    async def _follow(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                self._clients.apply(await read_frame(reader))
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            # The control process is gone or dropped us; its metrics channel drains this worker.
            log.warning("pool feed lost (%s): routing on the last view", exc)

    def _suspect(self, pool: str, index: int, generation: int) -> None:
        if self._writer is not None and not self._writer.is_closing():
            write_frame(self._writer, {"op": "suspect", "pool": pool, "index": index, "generation": generation})

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._writer is not None:
            self._writer.close()


def same_pools(started: GatewayConfig, reloaded: GatewayConfig, source: str) -> GatewayConfig:
    """``reloaded`` if its ``vllm-pool`` sections are the ones the control process runs; else ConfigError.

    A worker's SIGHUP reload would otherwise build a new or changed pool inside the worker (N
    supervisors, vLLM tied to one worker); the control process starts pools only at start-up.
    """
    running = {b.name: b for b in started.backends if isinstance(b, VLLMPoolBackendConfig)}
    problems = [
        (
            f"backends[{i}]",
            f"vllm-pool {b.name!r} is new or changed; with --workers the control process runs the pools "
            "and starts them only at start-up: restart the gateway to apply it",
        )
        for i, b in enumerate(reloaded.backends)
        if isinstance(b, VLLMPoolBackendConfig) and running.get(b.name) != b
    ]
    if problems:
        raise ConfigError(source, problems)
    return reloaded
