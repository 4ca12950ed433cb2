"""SIGHUP to the control process of ``gateway serve --workers N``: check, forward, roll (issue 15).

1. Check, once, here: the file is read and validated as ``gateway check-config`` does, then
   held against what runs (:func:`gateway.reload.restart_needed`: server keys fixed at start,
   ``auth``, a ``vllm-pool`` key its pool cannot apply; :func:`gateway.workers.pools.same_pools`:
   a shared backend added, removed or a multi-server ``vllm`` changed). Any problem: each is
   logged as one ERROR line with its YAML path, nothing is forwarded, every process keeps its
   config (the gateway workers would refuse the same file for the same reasons, N times over).
2. Forward SIGHUP to every gateway worker: each applies the file as a single gateway does
   (new requests on the new config, requests in flight finish on the old one); a changed
   pool section is taken by its client in place (routing, guards), with nothing to start.
3. Roll each ``vllm-pool`` whose section changed (``VLLMPoolBackend.reconfigure``), one vLLM
   worker at a time. The new worker is published to the gateway workers once ready; an old
   one leaves their routing, and is stopped only after every gateway worker has applied that
   view and the shared in-flight table shows none of their calls left on it
   (``PoolWatchers.synced``, ``backends.vllm.pool.shared``).

Why the gateway workers before the rollout: their reload takes milliseconds and a new vLLM
worker needs seconds to minutes to get ready, so the gateway workers build the adapter of each
new vLLM worker (capabilities, ``stream_usage``) from the new section, as the single-process
pool does; the old vLLM workers keep the adapters of the section they run. Rolling first would
announce the new vLLM workers to gateway workers still on the old section, whose adapters
would then stay built from it. Neither order can route a call to a stopped server: that is
step 3's wait, whatever the order. The one check that must come first is step 1, so that a
refused file reaches no process.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from backends.base import Reconfigurable
from gateway.configfile import ConfigError, config_error, endpoint_config_problems, load_config
from gateway.reload import restart_needed
from gateway.workers.pools import PoolWatchers, same_pools
from schemas.config import GatewayConfig, VLLMPoolBackendConfig

__all__ = ["ControlReload"]

log = logging.getLogger("gateway.workers")


class ControlReload:
    """The control process's reloads of ``path``; one at a time (a SIGHUP during a rollout waits for it)."""

    def __init__(
        self, path: str, config: GatewayConfig, pools: PoolWatchers | None, forward: Callable[[], None]
    ) -> None:
        self._path = Path(path)
        self.config = config  # the file as last applied (no command-line overrides: the workers read it so)
        self._pools = pools
        self._forward = forward
        self._lock = asyncio.Lock()
        self.reloads = 0

    async def reload(self) -> bool:
        """True when the file was forwarded and its pools rolled (a stopped rollout is logged, and
        the next reload of the same file resumes it); False when refused, nothing forwarded."""
        async with self._lock:
            log.info("config reload: reading %s", self._path)
            running = dict(self._pools.owner.pools) if self._pools is not None else {}
            try:
                config = load_config(self._path)
            except ConfigError as exc:
                config, problems = self.config, exc.problems
            else:
                problems = endpoint_config_problems(config) + restart_needed(self.config, config, running)
                try:
                    same_pools(self.config, config, str(self._path))
                except ConfigError as exc:
                    problems += exc.problems
            for line in config_error(self._path, problems).lines():
                log.error("config reload refused: %s", line)
            if problems:
                log.error(
                    "config reload refused: %d problem(s); every worker keeps serving the previous config, "
                    "nothing forwarded",
                    len(problems),
                )
                return False
            self.config = config
            self._forward()
            self.reloads += 1
            for i, section in enumerate(config.backends):
                live = running.get(section.name)
                if isinstance(section, VLLMPoolBackendConfig) and isinstance(live, Reconfigurable):
                    if not live.runs(section):  # compared with what runs: a stopped rollout resumes
                        report = await live.reconfigure(section)
                        level = logging.INFO if report.ok else logging.ERROR
                        log.log(level, "config reload: %s: backends[%d]: %s", self._path, i, report.describe())
            return True
