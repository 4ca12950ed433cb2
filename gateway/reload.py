"""Config reload on SIGHUP without losing a request (``gateway serve``; issue 15).

On SIGHUP the config file is read again with the loader ``gateway check-config`` uses.

- Invalid: every problem is logged as one ERROR line with its YAML path, and the running
  config keeps serving. A change that only a restart can apply (the listener's
  ``server.host``/``server.port``, other ``server`` keys fixed when the listener starts, the
  ``auth`` section, a ``vllm-pool`` key its running pool cannot apply: :func:`restart_needed`)
  is refused the same way: a reload applies all of the file or nothing.
- Valid: the new state is built next to the old one and swapped in one step of the event
  loop (:func:`swap`), so each request sees one config. A backend whose section is unchanged
  is the same object afterwards, with its circuit breaker, limiter and retry policy (its
  ``vllm-pool`` supervisor and vLLM workers stay up); a new or changed one is built and
  started before the swap. A changed ``vllm-pool`` section is the exception: the pool object
  stays and, after the swap, is reconfigured (``backends.base.Reconfigurable``): routing,
  probes and timings in place, a new model/args/GPU plan by replacing its workers one at a
  time while the others serve. :meth:`Reloader.reload` returns once that is done; a rollout
  whose new worker never gets ready stops there (logged with the section's YAML path, in
  the pool's ``status.json`` and ``gateway_pool_rollouts{outcome="failed"}``), the old
  workers keep serving, and the next reload resumes it. Requests that began before the
  swap finish on the objects they hold; a backend the new config no longer uses is closed
  once every request that began before the swap has ended (:class:`gateway.state.Generation`,
  counted by the request middleware), never under one. Metrics keep their registry: new
  model and backend names become label values, removed ones stop growing.

Connections are untouched: the listener, keep-alive connections and the drain state belong
to ``gateway.shutdown`` and outlive every reload.

Lifecycle: :func:`enable_reload` is called on the app before it starts. Its cleanup context
installs the SIGHUP handler once the backends are up and, at shutdown, stops the current
health prober and closes the backends still waiting to be retired.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from backends.base import Backend, Reconfigurable, ReconfigureReport
from backends.registry import build_backends, metric_collectors
from backends.transport.egress import warn_unverified
from gateway.app import PROBER, backend_guards, build_state
from gateway.clock import Clock
from gateway.configfile import ConfigError, load_config
from gateway.flow.health import HealthProber
from gateway.flow.router import BackendGuard, Router
from gateway.http.hardening import register_secrets
from gateway.security.guard import RequestGuard
from gateway.state import STATE, GatewayState, Generation
from schemas.config import BackendConfig, GatewayConfig, VLLMPoolBackendConfig

__all__ = ["LIVE_SERVER_KEYS", "RELOAD", "Reloader", "enable_reload", "restart_needed"]

log = logging.getLogger("gateway.reload")

# ``server`` keys a reload applies; every other one is read when the listener starts.
LIVE_SERVER_KEYS = frozenset({"admission", "client_body_timeout", "max_prompt_array", "audit_log"})

# GatewayState fields that belong to the process, not to one config: never swapped.
_KEPT = frozenset({"metrics", "in_flight", "draining", "started_at", "tracing"})
# Backend keys its BackendGuard (breaker, limiter, retry policy) is built from.
_GUARD_KEYS = ("max_concurrency", "retry", "circuit_breaker")


def restart_needed(
    old: GatewayConfig, new: GatewayConfig, running: Mapping[str, Backend] | None = None
) -> list[tuple[str, str]]:
    """What in ``new`` a running gateway cannot apply: ``(yaml_path, why)`` pairs, empty when none.

    ``running``: the backends serving ``old``; a changed section of a :class:`Reconfigurable`
    one is refused only for the keys it names.
    """
    problems: list[tuple[str, str]] = []
    for key in type(old.server).model_fields:
        if key not in LIVE_SERVER_KEYS and getattr(old.server, key) != getattr(new.server, key):
            why = "needs a new listener" if key in ("host", "port") else "is read when the listener starts"
            problems.append((f"server.{key}", f"changed; it {why}: restart the gateway to apply it"))
    for key in ("store", "store_prefix", "redis_timeout"):  # ttl and the memory bounds apply live
        if getattr(old.responses, key) != getattr(new.responses, key):
            problems.append((f"responses.{key}", "changed; the conversation store is opened at start: restart"))
    if old.auth != new.auth:
        problems.append(("auth", "changed; keys, their limits and the rate-limit store are set at start: restart"))
    elif new.auth is not None:
        # With auth on, each key's model list, caps and listing are built from these at start.
        if [m.name for m in old.models] != [m.name for m in new.models]:
            problems.append(("models", "model names changed while auth is on; restart the gateway to apply it"))
        if old.caps != new.caps:
            problems.append(("caps", "changed while auth is on; restart the gateway to apply it"))
        for key in ("max_prompt_array", "audit_log"):
            if getattr(old.server, key) != getattr(new.server, key):
                problems.append((f"server.{key}", "changed while auth is on; restart the gateway to apply it"))
    if old.telemetry != new.telemetry:
        problems.append(("telemetry", "changed; the trace exporter is set up at start: restart to apply it"))
    before = {b.name: b for b in old.backends}
    for i, backend in enumerate(new.backends):
        was = before.get(backend.name)
        if was is None or was == backend:
            continue
        live = (running or {}).get(backend.name)
        keys = live.restart_keys(backend) if isinstance(live, Reconfigurable) else None
        if keys is not None:
            for key, why in keys:
                problems.append((f"backends[{i}].{key}", f"{backend.name!r}: {key} changed; {why}: restart"))
        elif isinstance(was, VLLMPoolBackendConfig) or isinstance(backend, VLLMPoolBackendConfig):
            problems.append(
                (f"backends[{i}]", f"vllm-pool {backend.name!r} changed; its workers are replaced only at a restart")
            )
    return problems


def _to_reconfigure(running: Mapping[str, Backend], config: GatewayConfig) -> dict[str, tuple[int, BackendConfig]]:
    """Running backends that take their changed section in place: name -> (index, new section).

    Compared with what the backend runs, not with the last file read: a rollout that stopped
    left the pool on its old config, so reading the same file again resumes it.
    """
    out: dict[str, tuple[int, BackendConfig]] = {}
    for i, b in enumerate(config.backends):
        live = running.get(b.name)
        if isinstance(live, Reconfigurable) and live.restart_keys(b) is not None and not live.runs(b):
            out[b.name] = (i, b)
    return out


def _guards_of(router: Router) -> dict[str, BackendGuard]:
    return {route.backend.name: route.guard for entry in router.models.values() for route in entry.routes}


def _prober(config: GatewayConfig, backends: Mapping[str, Backend], guards: Mapping[str, BackendGuard]) -> HealthProber:
    return HealthProber(
        (backends[b.name], guards[b.name].breaker, b.health_check) for b in config.backends if b.health_check
    )


def swap(state: GatewayState, new: GatewayState) -> None:
    """Put ``new``'s config-bound parts into the running ``state``, all in one synchronous step.

    Handlers keep the ``state`` object (aiohttp freezes the app's keys at start); a request
    takes what it needs from it once (router entry, routes, guard) and keeps those objects.
    Every field is swapped except the process-wide ones, so a field added later follows.
    """
    for f in dataclasses.fields(state):
        if f.name not in _KEPT:
            setattr(state, f.name, getattr(new, f.name))


class Reloader:
    """Reloads ``path`` into the running ``app``; one reload at a time."""

    def __init__(
        self,
        app: web.Application,
        path: Path,
        server_overrides: Mapping[str, Any],
        clock: Clock | None,
        adapt: Callable[[GatewayConfig], GatewayConfig] | None = None,
    ) -> None:
        self._app = app
        self._path = path
        self._overrides = dict(server_overrides)
        self._adapt = adapt
        self._clock = clock if clock is not None else Clock()
        self._lock = asyncio.Lock()
        self._prober: HealthProber | None = None  # the app's own (PROBER) until the first reload
        self._older: list[Generation] = []  # retired generations, some maybe still busy
        self._retiring: set[asyncio.Task[None]] = set()
        self._pending: set[asyncio.Task[bool]] = set()
        self.reloads = 0  # applied reloads

    # --- hooks the app calls ------------------------------------------------------------------
    async def lifecycle(self, app: web.Application) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGHUP, self.on_sighup)
        try:
            yield
        finally:
            loop.remove_signal_handler(signal.SIGHUP)
            for task in self._pending:
                task.cancel()
            await asyncio.gather(*self._pending, return_exceptions=True)
            if self._prober is not None:
                await self._prober.close()
            # The drain is over: whatever a retired backend still waits for has been ended.
            for retiring in self._retiring:
                retiring.cancel()
            await asyncio.gather(*self._retiring, return_exceptions=True)

    def on_sighup(self) -> None:
        task = asyncio.get_running_loop().create_task(self.reload(), name="config-reload")
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    # --- the reload ---------------------------------------------------------------------------
    async def reload(self) -> bool:
        """Apply the config file now; True when the new config serves, False when the old one still does."""
        async with self._lock:
            state = self._app[STATE]
            if state.draining:
                log.warning("config reload skipped: the gateway is shutting down")
                return False
            log.info("config reload: reading %s", self._path)
            try:
                config = load_config(self._path)
                if self._overrides:  # --host/--port given to ``gateway serve`` hold across reloads
                    config = config.model_copy(update={"server": config.server.model_copy(update=self._overrides)})
                if self._adapt is not None:  # e.g. a worker's share of the gateway-wide caps (it may refuse)
                    config = self._adapt(config)
            except ConfigError as exc:
                for line in exc.lines():
                    log.error("config reload refused: %s", line)
                log.error("config reload refused: %d problem(s); still serving the previous config", len(exc.problems))
                return False
            problems = restart_needed(state.config, config, state.backends)
            for where, message in problems:
                log.error("config reload refused: %s: %s: %s", self._path, where, message)
            if problems:
                log.error("config reload refused: %d problem(s); still serving the previous config", len(problems))
                return False
            applied = await self._apply(state, config)
            if applied:
                self.reloads += 1
            return applied

    async def _apply(self, state: GatewayState, config: GatewayConfig) -> bool:
        old_config = state.config
        before = {b.name: b for b in old_config.backends}
        old_guards = _guards_of(state.router)
        pools = _to_reconfigure(state.backends, config)
        fresh = [
            b
            for b in config.backends
            if b.name not in pools and (before.get(b.name) != b or b.name not in state.backends)
        ]
        built = build_backends(fresh)
        started: list[Backend] = []
        for backend in built.values():
            try:
                await backend.start()
            except Exception as exc:  # the type only: an upstream's message may carry anything
                log.error(
                    "config reload refused: backend %s: starting it failed (%s); still serving the previous config",
                    backend.name,
                    type(exc).__name__,
                )
                await _close_all(started)
                return False
            started.append(backend)
        register_secrets(config)
        warn_unverified(config.backends, "config reload")
        backends = {b.name: built[b.name] if b.name in built else state.backends[b.name] for b in config.backends}
        metrics = state.metrics
        guards = backend_guards(config, metrics, self._clock)
        admission = config.server.admission
        for name in backends:
            guard = old_guards.get(name)
            if name in built or guard is None:
                continue
            if name in pools and any(getattr(pools[name][1], k) != getattr(before[name], k) for k in _GUARD_KEYS):
                continue  # a pool reconfigured in place with new limits: a fresh guard
            guard.limiter.queue_size, guard.limiter.timeout = admission.queue_size, admission.queue_timeout
            guards[name] = guard  # unchanged backend: its breaker's state, slots and queue carry over
        keys = [k.name for k in config.auth.keys] if config.auth is not None else []
        metrics.extend((m.name for m in config.models), backends, keys=keys, collectors=metric_collectors(backends))
        guard_unchanged = (
            old_config.auth == config.auth
            and old_config.caps == config.caps
            and old_config.server.max_prompt_array == config.server.max_prompt_array
            and old_config.server.audit_log == config.server.audit_log
            and [m.name for m in old_config.models] == [m.name for m in config.models]
        )
        new = build_state(
            config,
            backends,
            guards,
            metrics,
            self._clock,
            started_at=state.started_at,
            request_guard=state.request_guard if guard_unchanged else None,
            admission=state.admission if old_config.server.admission == admission else None,
            responses_state=state.responses_state,  # conversations outlive a reload
            previous_guard=state.request_guard,  # and so does the keys' spend
        )
        prober = _prober(config, backends, guards)
        retired = [b for name, b in state.backends.items() if backends.get(name) is not b]
        old_guard = state.request_guard if new.request_guard is not state.request_guard else None

        # --- the swap: synchronous, so no request sees half of it ----------------------------
        retiring = state.generation  # the new state brought its own: requests from now count there
        swap(state, new)
        state.responses_state.configure(config.responses)  # new ttl and bounds; the conversations stay
        retiring.retire()
        self._older = [g for g in self._older if g.idle is not None and not g.idle.is_set()] + [retiring]
        old_prober, self._prober = self._prober if self._prober is not None else self._app[PROBER], prober
        prober.start()
        # -------------------------------------------------------------------------------------

        await old_prober.close()
        task = asyncio.get_running_loop().create_task(self._retire(list(self._older), retired, old_guard))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)
        log.info(
            "config reload applied: %d model(s) over %d backend(s); %d backend(s) started, %d to close "
            "once their requests end",
            len(config.models),
            len(config.backends),
            len(built),
            len(retired),
        )
        for name, (i, section) in pools.items():
            live = backends[name]
            assert isinstance(live, Reconfigurable)
            _log_reconfigured(self._path, i, await live.reconfigure(section))
        return True

    @staticmethod
    async def _retire(waits: list[Generation], backends: list[Backend], guard: RequestGuard | None) -> None:
        """Close ``backends`` (and a replaced request guard) once the generations in ``waits``
        (the one just retired and every older one still busy: their requests may hold these
        backends too) have no request left; at shutdown, at once."""
        try:
            for generation in waits:
                assert generation.idle is not None
                await generation.idle.wait()
        finally:
            await _close_all(backends)
            if guard is not None:
                await guard.close()
            if backends:
                log.info("config reload: closed backend(s) %s", ", ".join(b.name for b in backends))


def _log_reconfigured(path: Path, index: int, report: ReconfigureReport) -> None:
    level, then = (logging.INFO, "") if report.ok else (logging.ERROR, "; a reload of the same file resumes it")
    log.log(level, "config reload: %s: backends[%d]: %s%s", path, index, report.describe(), then)


async def _close_all(backends: Iterable[Backend]) -> None:
    for backend in backends:
        try:
            await backend.close()
        except Exception:
            log.exception("closing backend %s failed", backend.name)


RELOAD: web.AppKey[Reloader] = web.AppKey("gateway_reload", Reloader)


def enable_reload(
    app: web.Application,
    path: str | Path,
    *,
    server_overrides: Mapping[str, Any] | None = None,
    clock: Clock | None = None,
    adapt: Callable[[GatewayConfig], GatewayConfig] | None = None,
) -> Reloader:
    """Make ``app`` reload ``path`` on SIGHUP; call before the app starts (``gateway serve`` does).

    ``server_overrides``: the ``server`` keys the command line set (``--host``, ``--port``),
    applied to every reloaded config as they were to the first; ``adapt``: applied after them
    (a worker's share of the caps, as for the first config); a ``ConfigError`` from it refuses the reload.
    """
    reloader = Reloader(app, Path(path), server_overrides or {}, clock, adapt)
    app[RELOAD] = reloader
    app.cleanup_ctx.append(reloader.lifecycle)
    return reloader
