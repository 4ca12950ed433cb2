"""One worker of ``gateway serve --workers N``: ``python -m gateway worker ...``, started by the control process.

A clean interpreter (exec'd, never a fork of the threaded control process) that serves requests
on the listening socket it inherited (``--fd``), with the gateway-wide caps divided by N
(:mod:`gateway.workers.caps`), rotations started at a random route, and its metrics merged with
the other workers' through the control channel (:mod:`gateway.workers.channel`). SIGTERM drains it
exactly as it drains a single-process gateway (:mod:`gateway.shutdown`). Its log lines, access log
and audit lines carry ``worker=K``.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import logging
import signal
import socket
import sys
from collections.abc import Callable

from backends.registry import build_worker_backends
from gateway.configfile import ConfigError, load_config
from gateway.workers.caps import overshoots, split_caps
from gateway.workers.channel import ControlClient
from gateway.workers.pools import PoolFeed, same_pools
from schemas.config import GatewayConfig, worker_notes

__all__ = ["add_worker_parser", "worker_main"]

log = logging.getLogger("gateway")

_PR_SET_PDEATHSIG = 1


def add_worker_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    # Started by `serve --workers N` only. No help= at all: argparse then leaves it out of the command
    # list (help=SUPPRESS printed "==SUPPRESS==" there); the caller's metavar leaves it out of the usage.
    worker = sub.add_parser("worker")
    worker.add_argument("--config", required=True)
    worker.add_argument("--fd", type=int, required=True, help="the inherited listening socket")
    worker.add_argument("--index", type=int, required=True, help="K in worker=K (0..N-1)")
    worker.add_argument("--workers", type=int, required=True, help="N: the caps are divided by it")
    worker.add_argument("--control", required=True, help="the control process's Unix socket")
    worker.add_argument("--log-level", default="INFO")


class _AuditWorker(logging.Filter):
    """Adds ``"worker": K`` to each JSON audit line (gateway.security.audit writes one object per line)."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self._tail = f',"worker":{index}}}'

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg
        if isinstance(msg, str) and msg.endswith("}"):
            record.msg = msg[:-1] + self._tail
        return True


def _die_with_parent() -> None:
    """SIGTERM (a drain) when the control process dies, so no worker outlives its gateway."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - not Linux; the channel's end also drains
        pass


def worker_main(args: argparse.Namespace) -> int:
    index: int = args.index
    logging.basicConfig(level=args.log_level, format=f"%(asctime)s %(levelname)s %(name)s worker={index}: %(message)s")
    logging.getLogger("gateway.audit").addFilter(_AuditWorker(index))
    _die_with_parent()
    # SIGHUP's default action would kill the worker: ignored until the app's reloader claims it.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    started = config
    for cap in overshoots(config, args.workers) if index == 0 else ():
        log.warning("%s is below --workers %d: each worker gets 1, so up to %d run at once", cap, *[args.workers] * 2)
    for note in worker_notes(config, args.workers) if index == 0 else ():
        log.warning("%s", note)
    config = split_caps(config, args.workers, index)
    sock = socket.socket(fileno=args.fd)
    loop_factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency, but not on every platform
        pass
    else:
        loop_factory = uvloop.new_event_loop
    from gateway.app import create_app
    from gateway.flow.router import spread_starts
    from gateway.reload import enable_reload
    from gateway.shutdown import serve
    from gateway.state import STATE

    spread_starts()  # N workers must not all send their first request to the same route
    # vllm-pool backends: the control process runs them; this worker routes over their endpoints.
    built, pools = build_worker_backends(config.backends, index)
    app = create_app(config, backends=built, workers=args.workers)

    # SIGHUP (forwarded by the control process) reloads the file in every worker, each taking
    # its share of the caps as at start.
    # The control process checked the file before forwarding; a changed pool section is taken by
    # its client here and rolled there; an added or removed one is refused (gateway.workers.pools.same_pools).
    def adapt(reloaded: GatewayConfig) -> GatewayConfig:
        return split_caps(same_pools(started, reloaded, args.config), args.workers, index)

    enable_reload(app, args.config, adapt=adapt)
    metrics = app[STATE].metrics
    server = config.server

    async def run() -> None:
        control = ControlClient(args.control, index, metrics.registry)
        await control.start()
        metrics.gateway_view = control.scrape
        feed = PoolFeed(args.control, pools) if pools else None
        if feed is not None:
            await feed.start()  # the pools' endpoints are known before the first request
        try:
            await serve(
                app,
                host=server.host,
                port=server.port,
                sock=sock,
                drain_timeout=server.drain_timeout,
                drain_delay=server.drain_delay,
                access_log=logging.getLogger("gateway.access") if server.access_log else None,
            )
        finally:
            if feed is not None:
                await feed.close()
            await control.close()  # the last push: nothing this worker counted is lost

    log.info("worker %d (of %d) serving", index, args.workers)
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(run())
    return 0
