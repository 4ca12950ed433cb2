"""A ``vllm`` backend over several servers: ``base_urls``, or a DNS name re-resolved periodically.

The same choice of server as inside a ``vllm-pool`` (least load refined by each server's
scraped queue and KV-cache usage, prefix affinity; ``backends.vllm.routing.balancer``) and
the same retries across servers (``backends.vllm.routing.dispatch``), over servers someone
else runs: for example vLLM pods behind a Kubernetes headless Service, whose DNS name
resolves to one A record per ready pod.

Health is probed (``GET /health`` every ``probe.interval``): a server failing
``probe.failures`` probes in a row, or refusing a connection, is skipped until a probe
passes again. Servers start as available (optimistic) so the gateway serves at once.
With ``discovery``, addresses that appear are added and addresses that disappear are
dropped (their calls in flight finish). Each server keeps one ``worker`` index while it
exists (freed indices are reused, so metric labels stay bounded).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar
from urllib.parse import urlsplit

from backends.capabilities import Capabilities
from backends.errors import UpstreamError
from backends.transport import egress_of, make_transport
from backends.transport.base import get_ok
from backends.transport.httptools_client import FastHTTPTransport
from backends.vllm.adapter import VLLMBackend
from backends.vllm.capabilities import VLLM_CAPABILITIES
from backends.vllm.routing.balancer import Endpoint
from backends.vllm.routing.dispatch import DispatchedBackend, Dispatcher
from backends.vllm.routing.inflight import InFlightTable
from backends.vllm.routing.scrape import parse_vllm_metrics
from backends.vllm.routing.signals import EngineSignals
from backends.vllm.routing.status import PoolStatus, WorkerStatus, endpoint_fields, endpoints_view, fill_in_flight
from schemas.config import TimeoutConfig, VLLMBackendConfig

__all__ = ["Resolver", "VLLMEndpointsBackend", "events_address", "remote_signals", "resolve_dns", "server_config"]

# --workers N: the in-flight table's columns for a discovered backend (servers come and go; their
# indices are reused, so this bounds the servers at once, not over time). Beyond it: counted per worker.
DISCOVERY_COLUMNS = 256

log = logging.getLogger("gateway.pool")

Resolver = Callable[[str, int], Awaitable[list[str]]]  # (host, port) -> addresses


async def resolve_dns(host: str, port: int) -> list[str]:
    """The distinct addresses ``host`` resolves to now, sorted."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


class _Server:
    __slots__ = ("endpoint", "failures", "root")

    def __init__(self, endpoint: Endpoint, root: str) -> None:
        self.endpoint = endpoint
        self.root = root  # scheme://host:port, where /health and /metrics live
        self.failures = 0


class VLLMEndpointsBackend(DispatchedBackend):
    kind: ClassVar[str] = "vllm"
    default_capabilities: ClassVar[Capabilities] = VLLM_CAPABILITIES

    def __init__(self, config: VLLMBackendConfig, *, resolver: Resolver = resolve_dns) -> None:
        super().__init__(config.name, self.default_capabilities.with_overrides(config.capabilities))
        self.unknown_tables(config.tool_parser)
        self.config = config
        self._resolver = resolver
        self.dispatcher = Dispatcher(
            config.name,
            config.routing,
            on_failure=self._suspect,
            hopeless=lambda: False,
            describe=self._describe,
        )
        self._servers: dict[str, _Server] = {}  # by base URL
        egress = egress_of(config)  # probes and scrapes leave as the requests do (proxy, TLS)
        self._transport = make_transport(config, egress)
        t = config.probe.timeout
        self._control = FastHTTPTransport(
            config.name, TimeoutConfig(connect=t, first_byte=t, total=t, stream_idle=t), 64, egress=egress
        )
        self._tasks: list[asyncio.Task[None]] = []
        # With ``--workers N`` the control process runs the discovery, probes and scrapes once: it
        # is told of every round (to publish the servers to the gateway workers, gateway.workers.pools).
        self.listeners: list[Callable[[], None]] = []
        self.in_flight_table: InFlightTable | None = None
        # The gateway's calls in flight to a server (the control process of --workers N reads its table).
        self.in_flight_of: Callable[[Endpoint], int] = lambda ep: ep.gateway_in_flight
        self.signals = remote_signals(config, self.dispatcher)

    def _changed(self) -> None:
        self.signals.sync()
        for listener in self.listeners:
            listener()

    # --- servers ---------------------------------------------------------------------------
    async def _set_servers(self, urls: list[str]) -> None:
        wanted = set(urls)
        for url in [u for u in self._servers if u not in wanted]:
            server = self._servers.pop(url)
            server.endpoint.available = False
            self.dispatcher.endpoints.remove(server.endpoint)
            log.info("backend %s: server %s gone", self.name, url)
        used = {s.endpoint.index for s in self._servers.values()}
        free = (i for i in range(len(urls) + len(used) + 1) if i not in used)
        new = [url for url in dict.fromkeys(urls) if url not in self._servers]
        adapters = [VLLMBackend(self._server_config(url), self._transport) for url in new]
        # Each adapter reads its server's version (bounded; an unreachable one keeps safe defaults).
        await asyncio.gather(*(adapter.start() for adapter in adapters), return_exceptions=True)
        for url, adapter in zip(new, adapters, strict=True):
            endpoint = Endpoint(
                next(free), self.config.routing.affinity_entries, url, self.config.routing.kv_index_blocks
            )
            endpoint.adapter = adapter
            endpoint.available = True
            endpoint.generation = 1
            endpoint.events = events_address(self.config, url)
            self._servers[url] = _Server(endpoint, url.removesuffix("/").removesuffix("/v1"))
            self.dispatcher.endpoints.append(endpoint)
            log.info("backend %s: server %s added", self.name, url)
        self.dispatcher.endpoints.sort(key=lambda ep: ep.index)
        if adapters:
            # The servers behind one backend run one vLLM release; capabilities follow the first.
            self.take_tables(adapters[0])
            self.dispatcher.notify()

    def _server_config(self, url: str) -> VLLMBackendConfig:
        return server_config(self.config, url)

    async def _discover(self) -> None:
        discovery = self.config.discovery
        assert discovery is not None
        try:
            addresses = await self._resolver(discovery.dns, discovery.port)
        except OSError as exc:  # keep the servers we know: a DNS hiccup must not empty the backend
            log.warning("backend %s: cannot resolve %s: %s", self.name, discovery.dns, exc)
            return
        hosts = [f"[{a}]" if ":" in a else a for a in addresses]
        await self._set_servers([f"{discovery.scheme}://{h}:{discovery.port}{discovery.path}" for h in hosts])

    async def _discover_loop(self) -> None:
        assert self.config.discovery is not None
        while True:
            await asyncio.sleep(self.config.discovery.interval)
            await self._discover()
            self._changed()

    # --- probes ------------------------------------------------------------------------------
    async def _get(self, url: str) -> bytes | None:
        return await get_ok(self._control, url)

    async def _probe(self, server: _Server) -> None:
        ok = await self._get(server.root + "/health") is not None
        ep = server.endpoint
        if ok:
            server.failures = 0
            if not ep.available:
                ep.generation += 1  # it may have restarted: a new try for calls that failed on it
                ep.prefixes.clear()
                ep.blocks.clear()
                ep.available = True
                log.info("backend %s: server %s healthy again", self.name, ep.url)
                self.dispatcher.notify()
        else:
            server.failures += 1
            if server.failures >= self.config.probe.failures and ep.available:
                ep.available = False
                log.warning("backend %s: server %s failed %d probes; skipped", self.name, ep.url, server.failures)

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.gather(*(self._probe(s) for s in list(self._servers.values())))
            self._changed()
            await asyncio.sleep(self.config.probe.interval)

    async def _scrape(self, server: _Server) -> None:
        body = await self._get(server.root + "/metrics")
        ep = server.endpoint
        if body is None:
            ep.load = ep.load.failed()  # routing falls back on the gateway's own count (score)
        else:
            ep.load = parse_vllm_metrics(body.decode("utf-8", "replace"), self.in_flight_of(ep))

    async def _scrape_loop(self) -> None:
        while True:
            await asyncio.gather(*(self._scrape(s) for s in list(self._servers.values()) if s.endpoint.available))
            self._changed()
            await asyncio.sleep(self.config.routing.metrics_interval)

    def _suspect(self, endpoint: Endpoint, exc: UpstreamError) -> None:
        if exc.reason in ("connect", "closed") and endpoint.available:
            endpoint.available = False
            log.warning("backend %s: cannot connect to %s; skipped until a probe passes", self.name, endpoint.url)
            self._changed()

    def _describe(self) -> str:
        up = sum(ep.available for ep in self.dispatcher.endpoints)
        return f"{up} of {len(self.dispatcher.endpoints)} servers available"

    # --- Backend -------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.config.discovery is not None:
            await self._discover()
            self._tasks.append(asyncio.create_task(self._discover_loop(), name=f"{self.name} discovery"))
        else:
            await self._set_servers([str(url).rstrip("/") for url in self.config.base_urls])
        self._tasks.append(asyncio.create_task(self._probe_loop(), name=f"{self.name} probes"))
        self._tasks.append(asyncio.create_task(self._scrape_loop(), name=f"{self.name} metrics"))

    async def close(self) -> None:
        self.dispatcher.close()
        await self.signals.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._transport.close()
        await self._control.close()

    def pool_status(self) -> PoolStatus:
        workers = [
            WorkerStatus(index=ep.index, state="ready" if ep.available else "unhealthy", **endpoint_fields(ep))
            for ep in self.dispatcher.endpoints
        ]
        table = self.in_flight_table
        if table is not None:  # --workers N: the gateway workers route; this process probes
            fill_in_flight(workers, table.cells, table.rows, table.cols)
        return PoolStatus(
            backend=self.name,
            kind=self.kind,
            workers=workers,
            decisions=dict(self.dispatcher.balancer.decisions),
            scoring=self.signals.describe(),
        )

    # --- shared by the gateway workers of --workers N (backends.vllm.pool.shared) ---------------
    def view(self) -> dict[str, Any]:
        return endpoints_view(self.pool_status(), self.dispatcher.endpoints, hopeless=False, describe=self._describe())

    def table_columns(self) -> int:
        return DISCOVERY_COLUMNS if self.config.discovery is not None else len(self.config.base_urls)

    def suspect(self, endpoint: Endpoint, exc: UpstreamError) -> None:
        self._suspect(endpoint, exc)


def remote_signals(config: VLLMBackendConfig, dispatcher: Dispatcher) -> EngineSignals:
    """The servers' tokenizer (``routing.tokenizer``) and KV events (``routing.kv_events``)."""
    events = config.routing.kv_events
    return EngineSignals(
        config.name,
        dispatcher,
        tokenizer=config.routing.tokenizer,
        seed=events.hash_seed if events is not None else None,
        topic=events.topic if events is not None else "",
        address=lambda ep: ep.events,
    )


def events_address(config: VLLMBackendConfig, url: str) -> str | None:
    """Where the server at ``url`` publishes its KV events (``routing.kv_events.endpoint``), or None."""
    events = config.routing.kv_events
    if events is None:
        return None
    host = urlsplit(url).hostname or ""
    return events.endpoint.replace("{host}", f"[{host}]" if ":" in host else host)


def server_config(config: VLLMBackendConfig, url: str, version: str | None = None) -> VLLMBackendConfig:
    """The single-server config of one of ``config``'s servers (``version``: known already, not read again)."""
    data = config.model_dump(exclude={"base_urls", "discovery", "routing", "probe"})
    data["base_url"] = url
    if version is not None:
        data["version"] = version
    return VLLMBackendConfig.model_validate(data)
