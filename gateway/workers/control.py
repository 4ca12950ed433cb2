"""The control process of ``gateway serve --workers N``: owns what must exist once, serves nothing.

It binds the listening socket (``SO_REUSEADDR``) and starts N workers as clean interpreters
(``python -m gateway worker``, the socket passed with ``pass_fds``): every worker accepts on the
same socket, and ``UV_TCP_SINGLE_ACCEPT=1`` makes each take one connection per turn instead of
draining the queue, so connections spread (the spec measured this against ``SO_REUSEPORT``,
whose per-listener queue loses its connections when a worker dies).

- A worker that exits is restarted after a backoff (0.1 s doubling to 10 s; reset after it ran 10 s).
- SIGTERM/SIGINT: its copy of the socket closes and every worker gets SIGTERM at once: each drains
  as a single gateway does (``Connection: close``, streams finish within ``drain_timeout``); the
  control process exits when they have, killing any still there ``drain_timeout + 15`` s later.
- SIGHUP: the file is checked here first (refused: logged with YAML paths, nothing forwarded),
  then forwarded to every worker (config reload happens in each), then a changed ``vllm-pool``
  is rolled here, one vLLM worker at a time (:mod:`gateway.workers.sighup`).
- It merges the workers' metrics (:mod:`gateway.workers.merge`) for any worker's ``/metrics``.
- It owns the ``vllm-pool`` backends and the ``vllm`` backends over ``base_urls``/``discovery``
  (:mod:`gateway.workers.pools`): started before the first worker, stopped after the last one
  drained; their vLLM processes, discovery, probes, scrapes and version detection run here once,
  and the workers route over what it publishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
from pathlib import Path

from backends.registry import PoolOwnership
from gateway.workers.channel import read_frame, write_frame
from gateway.workers.merge import MetricsMerger
from gateway.workers.pools import PoolWatchers
from gateway.workers.sighup import ControlReload
from schemas.config import GatewayConfig, VLLMBackendConfig, VLLMPoolBackendConfig

__all__ = ["Control"]

log = logging.getLogger("gateway.workers")

_BACKOFF_FIRST = 0.1
_BACKOFF_MAX = 10.0
_STABLE = 10.0  # seconds a worker must run before its restarts count as fresh
_KILL_AFTER = 15.0  # seconds beyond drain_timeout before a worker that will not stop is killed


def bind(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """The listening socket every worker inherits."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.setblocking(False)
    sock.set_inheritable(True)
    return sock


class Control:
    def __init__(
        self,
        config_path: str,
        workers: int,
        sock: socket.socket,
        *,
        drain_timeout: float,
        log_level: str = "INFO",
        pools: list[VLLMPoolBackendConfig | VLLMBackendConfig] | None = None,
        config: GatewayConfig | None = None,
    ) -> None:
        self._config_path = config_path
        self._workers = workers
        self._sock = sock
        self._kill_after = drain_timeout + _KILL_AFTER
        self._log_level = log_level
        self._procs: dict[int, asyncio.subprocess.Process] = {}
        self._stopping = False
        self._merger = MetricsMerger()
        self._ids = itertools.count(1)
        self._pool_configs = pools or []
        self._pools: PoolWatchers | None = None
        self._config = config  # the file as read at start (what SIGHUP's reload is held against)
        self.reload: ControlReload | None = None
        self._reloading: set[asyncio.Task[bool]] = set()
        self.restarts = 0

    async def run(self) -> int:
        """Until SIGTERM/SIGINT and every worker has stopped."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        workdir = Path(tempfile.mkdtemp(prefix="gateway-control-"))
        channel = str(workdir / "control.sock")
        server = await asyncio.start_unix_server(self._on_worker, channel)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        slots: list[asyncio.Task[None]] = []
        try:
            if self._pool_configs:
                self._pools = PoolWatchers(PoolOwnership(self._pool_configs, self._workers, workdir))
                await self._pools.start()  # spawns the vLLM processes; the workers find them
            if self._config is not None:
                forward = functools.partial(self._forward, signal.SIGHUP)
                self.reload = ControlReload(self._config_path, self._config, self._pools, forward)
                loop.add_signal_handler(signal.SIGHUP, self._on_sighup)
            else:  # no config to check against: each worker checks the file itself
                loop.add_signal_handler(signal.SIGHUP, self._forward, signal.SIGHUP)
            slots = [asyncio.create_task(self._keep(k, channel)) for k in range(self._workers)]
            await stop.wait()
            log.info("shutting down: draining %d worker(s)", len(self._procs))
            self._stopping = True
            self._sock.close()  # the workers' copies keep listening until each one's drain stops it
            self._forward(signal.SIGTERM)
            _, pending = await asyncio.wait(slots, timeout=self._kill_after)
            for proc in self._procs.values():
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            if pending:
                log.warning("%d worker(s) did not stop in time: killed", len(pending))
                await asyncio.wait(pending, timeout=5.0)
        finally:
            for task in (*slots, *self._reloading):
                task.cancel()
            await asyncio.gather(*self._reloading, return_exceptions=True)
            if self._pools is not None:
                await self._pools.close()  # only now: the workers' calls to vLLM have finished
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)
            server.close()
            shutil.rmtree(workdir, ignore_errors=True)
        return 0

    def _on_sighup(self) -> None:
        if self.reload is None or self._stopping:
            return
        task = asyncio.get_running_loop().create_task(self.reload.reload(), name="control-reload")
        self._reloading.add(task)
        task.add_done_callback(self._reloading.discard)

    def _forward(self, sig: int) -> None:
        for proc in self._procs.values():
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
        if sig == signal.SIGHUP:
            log.info("SIGHUP forwarded to %d worker(s)", len(self._procs))

    async def _keep(self, index: int, channel: str) -> None:
        """Worker ``index``: started, and restarted with a backoff whenever it dies, until the drain."""
        loop = asyncio.get_running_loop()
        failures = 0
        while not self._stopping:
            started = loop.time()
            proc = await self._spawn(index, channel)
            self._procs[index] = proc
            code = await proc.wait()
            self._procs.pop(index, None)
            if self._stopping:
                return
            failures = 0 if loop.time() - started >= _STABLE else failures + 1
            delay = min(_BACKOFF_MAX, _BACKOFF_FIRST * 2 ** max(0, failures - 1)) if failures else _BACKOFF_FIRST
            log.warning("worker %d (pid %d) exited with %s; restarting in %.1fs", index, proc.pid, code, delay)
            self.restarts += 1
            await asyncio.sleep(delay)

    async def _spawn(self, index: int, channel: str) -> asyncio.subprocess.Process:
        fd = self._sock.fileno()
        env = os.environ | {"UV_TCP_SINGLE_ACCEPT": "1"}
        argv = [sys.executable, "-m", "gateway", "worker", "--config", self._config_path, "--fd", str(fd)]
        argv += ["--index", str(index), "--workers", str(self._workers), "--control", channel]
        argv += ["--log-level", self._log_level]
        return await asyncio.create_subprocess_exec(*argv, pass_fds=(fd,), env=env)

    async def _on_worker(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One worker's channel (see gateway.workers.channel); its end retires the worker's gauges."""
        ident = next(self._ids)
        try:
            first = True
            while True:
                message = await read_frame(reader)
                if first and message.get("op") == "watch" and self._pools is not None:
                    await self._pools.watch(reader, writer)  # a worker's pool feed (gateway.workers.pools)
                    return
                first = False
                op = message.get("op")
                snap = message.get("snapshot")
                if isinstance(snap, list):
                    self._merger.update(ident, snap)
                if op == "scrape":
                    write_frame(writer, {"text": self._merger.render().decode()})
                else:
                    write_frame(writer, {})
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            self._merger.retire(ident)
            writer.close()
