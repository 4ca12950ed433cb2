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
call could not connect, and ``{"op": "applied", "seq": n}`` after applying frame ``n`` (frames
are numbered), so a rollout stops a vLLM worker only once every gateway worker routes without
it (:meth:`PoolWatchers.synced`). Why this channel rather than the status file or shared memory: the
views are small, change at most once per scrape interval, and must arrive at once when a vLLM
worker becomes ready or goes away (polling a file trades latency for wake-ups). The one figure
that changes per request, calls in flight, has its shared-memory table instead
(``backends.vllm.routing.inflight``): no message per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from backends.registry import PoolClients, PoolOwnership, shared_configs
from gateway.configfile import ConfigError
from gateway.workers.channel import read_frame, write_frame
from schemas.config import GatewayConfig, VLLMPoolBackendConfig

__all__ = ["PoolFeed", "PoolWatchers", "same_pools"]

log = logging.getLogger("gateway.workers")

_MAX_BACKLOG = 4 * 1024 * 1024  # bytes unsent to one worker before its watch is dropped


class PoolWatchers:
    """The control process's end: every worker's watch connection, told each change of ``owner``.

    Frames are numbered (``seq``); a worker answers ``{"op": "applied", "seq": n}`` once it routes
    on frame ``n``. :meth:`synced` waits for those answers: a rollout retires a vLLM worker only
    after every gateway worker has taken it out of its routing (then its column of the in-flight
    table can only go down, and reading zero there means no call is left on it).
    """

    def __init__(self, owner: PoolOwnership) -> None:
        self.owner = owner
        self._watchers: dict[asyncio.StreamWriter, int] = {}  # -> the last frame it applied
        self._scheduled = False
        self._seq = 0
        self._acked = asyncio.Event()  # replaced at each answer (see synced)

    async def start(self) -> None:
        await self.owner.start(self._changed, self.synced)

    async def close(self) -> None:
        for writer in list(self._watchers):
            writer.close()
        await self.owner.close()

    def _changed(self) -> None:
        # Coalesced: every change of one loop turn goes out as one frame.
        if not self._scheduled and self._watchers:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._publish)

    def _frame(self) -> dict[str, Any]:
        self._seq += 1
        return {**self.owner.frame(), "seq": self._seq}

    def _publish(self) -> None:
        self._scheduled = False
        frame = self._frame()
        for writer in list(self._watchers):
            transport = writer.transport
            if transport.is_closing() or transport.get_write_buffer_size() > _MAX_BACKLOG:
                self._drop(writer)  # a stuck worker: it routes on its last view until it dies
                writer.close()
                continue
            write_frame(writer, frame)

    def _drop(self, writer: asyncio.StreamWriter) -> None:
        self._watchers.pop(writer, None)
        self._wake()

    def _wake(self) -> None:
        self._acked.set()
        self._acked = asyncio.Event()

    async def synced(self) -> None:
        """Publish the pools now; return once every gateway worker watching has applied that frame
        (or hung up: a worker that comes later starts from a newer one)."""
        self._publish()
        seq = self._seq
        while any(applied < seq for applied in self._watchers.values()):
            await self._acked.wait()

    async def watch(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One worker's watch connection, until it ends."""
        self._watchers[writer] = 0
        try:
            write_frame(writer, self._frame())
            await writer.drain()
            while True:
                message = await read_frame(reader)
                op = message.get("op")
                if op == "applied":
                    seq = message.get("seq")
                    if isinstance(seq, int) and writer in self._watchers:
                        self._watchers[writer] = max(self._watchers[writer], seq)
                        self._wake()
                elif op == "suspect":
                    self.owner.suspect(message.get("pool"), message.get("index"), message.get("generation"))
        finally:
            self._drop(writer)


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
        self._apply(await read_frame(reader))
        self._task = asyncio.create_task(self._follow(reader))

    async def _follow(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                self._apply(await read_frame(reader))
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            # The control process is gone or dropped us; its metrics channel drains this worker.
            log.warning("pool feed lost (%s): routing on the last view", exc)

    def _apply(self, frame: dict[str, Any]) -> None:
        self._clients.apply(frame)
        # Routing follows this frame from now on: the control process may stop what it retired.
        seq = frame.get("seq")
        if isinstance(seq, int) and self._writer is not None and not self._writer.is_closing():
            write_frame(self._writer, {"op": "applied", "seq": seq})

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
    """``reloaded`` if the control process can serve its shared backends as they are; else ConfigError.

    A changed ``vllm-pool`` section passes: the control process rolls its vLLM workers
    (``gateway.workers.sighup``) and each gateway worker's client takes the section in place
    (routing, guards; keys only a restart applies are refused by ``gateway.reload.restart_needed``).
    Refused, naming the section: a pool added or removed (the control process starts and stops
    pools only with the gateway: an added one would need its processes, its in-flight table and
    a client in every worker, built at start), and a changed multi-server ``vllm`` backend (the
    worker would build its discovery and probes itself, once per worker).
    """
    running = {b.name: b for b in shared_configs(started.backends)}
    problems = []
    for i, b in enumerate(reloaded.backends):
        was = running.pop(b.name, None)
        if isinstance(was, VLLMPoolBackendConfig) and isinstance(b, VLLMPoolBackendConfig):
            continue  # rolled by the control process
        if (was is None and b in shared_configs([b])) or (was is not None and b != was):
            what = "new" if was is None else "changed"
            problems.append((f"backends[{i}]", f"{b.type} backend {b.name!r} is {what}; {_AT_START}"))
    for b in running.values():
        problems.append(("backends", f"{b.type} backend {b.name!r} is removed; {_AT_START}"))
    if problems:
        raise ConfigError(source, problems)
    return reloaded


_AT_START = (
    "with --workers the control process starts its shared backends only at start-up: restart the gateway to apply it"
)
