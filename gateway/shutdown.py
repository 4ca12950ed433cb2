"""Serving until SIGTERM/SIGINT, then draining: what ``gateway serve`` runs.

On the signal:

1. ``/health`` answers 503 ``draining`` at once, and for ``server.drain_delay`` seconds
   the gateway keeps accepting, so a load balancer sees it leave before connections are
   refused;
2. it stops listening and closes idle keep-alive connections (busy ones close after
   their current request);
3. in-flight completions and streams get up to ``server.drain_timeout`` seconds to finish;
4. those still running are cancelled: a stream ends with an SSE error event
   (``gateway_shutting_down``) and ``data: [DONE]``, a request still waiting gets a 503,
   never a bare cut;
5. the app's cleanup closes probes and upstream clients.

aiohttp's own ``run_app`` shutdown waits up to twice its timeout and cancels handlers
while closing their connections, so a stream could not say why it ended; hence this module.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from aiohttp import web

from gateway.state import STATE

__all__ = ["serve"]

log = logging.getLogger("gateway")


async def serve(
    app: web.Application,
    *,
    host: str,
    port: int,
    drain_timeout: float,
    drain_delay: float = 0.0,
    access_log: logging.Logger | None = None,
) -> None:
    """Serve the gateway ``app`` until SIGTERM or SIGINT, then drain as the module docstring says."""
    state = app[STATE]
    in_flight = state.in_flight
    runner = web.AppRunner(
        app, handle_signals=False, handler_cancellation=True, access_log=access_log, shutdown_timeout=1.0
    )
    await runner.setup()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = (signal.SIGTERM, signal.SIGINT)
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        for sig in signals:
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        state.draining = True  # /health answers 503 from now on
        log.info(
            "shutting down: %d request(s) in flight; draining for up to %.0fs (after a %.0fs delay)",
            len(in_flight),
            drain_timeout,
            drain_delay,
        )
        if drain_delay > 0:
            await asyncio.sleep(drain_delay)
        await site.stop()  # no new connections
        if runner.server is not None:
            runner.server.pre_shutdown()  # idle keep-alive connections close now, busy ones after their request
        if not await in_flight.wait_idle(drain_timeout):
            log.warning("drain timeout: ending %d request(s) still in flight", len(in_flight))
            await in_flight.cancel_all()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
        await runner.cleanup()  # on_shutdown, then cleanup_ctx: probes, upstream clients
