"""A pool shared by the gateway workers of ``--workers N``, without processes: the in-flight table,
least load over the whole gateway, a worker's client applying the control process's views."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from backends.errors import UpstreamConnectError, UpstreamTimeoutError
from backends.registry import build_worker_backends, shared_configs
from backends.vllm.adapter import VLLMBackend
from backends.vllm.pool.client import VLLMEndpointsClient, VLLMPoolClient
from backends.vllm.pool.shared import PoolClients, PoolOwnership
from backends.vllm.routing.balancer import Balancer
from backends.vllm.routing.inflight import InFlightTable, SharedEndpoint
from backends.vllm.versions import VLLMVersion
from gateway.app import create_app
from gateway.configfile import parse_config
from schemas.config import PoolRoutingConfig
from tests.backends.vllm.pool.conftest import MODEL, pool_config, wait_for
from tests.backends.vllm.pool.standin_worker import build_app, parse_args
from tests.conftest import free_port, serve_app

ROUTING = PoolRoutingConfig(strategy="least-load")


def _worker(table: InFlightTable, row: int, endpoints: int = 2) -> Balancer:
    """One gateway worker's balancer over the pool's endpoints, its counts in ``row``."""
    balancer = Balancer(ROUTING)
    for i in range(endpoints):
        ep = SharedEndpoint(i, 8, table, row)
        ep.url, ep.available = f"http://127.0.0.1:{9000 + i}/v1", True
        balancer.endpoints.append(ep)
    return balancer


def test_each_worker_writes_its_row_and_reads_the_column(tmp_path: Path) -> None:
    owner = InFlightTable(tmp_path / "t", rows=3, cols=2, create=True)
    a, b = _worker(InFlightTable(owner.path, 3, 2), 0), _worker(InFlightTable(owner.path, 3, 2), 2)
    b.endpoints[1].begin()
    b.endpoints[1].begin()
    a.endpoints[1].begin()
    assert [ep.in_flight for ep in a.endpoints] == [0, 1]  # its own calls
    assert [ep.gateway_in_flight for ep in a.endpoints] == [0, 3]  # the gateway's
    assert owner.row(2) == [0, 2] and owner.column(1) == 3
    b.endpoints[1].end()
    assert a.endpoints[1].gateway_in_flight == 2
    # A restarted worker 2 starts from zero: its predecessor's calls died with it.
    InFlightTable(owner.path, 3, 2).clear_row(2)
    assert a.endpoints[1].gateway_in_flight == 1


def test_least_load_sees_the_calls_of_the_other_workers(tmp_path: Path) -> None:
    table = InFlightTable(tmp_path / "t", rows=2, cols=2, create=True)
    a, b = _worker(table, 0), _worker(table, 1)
    for _ in range(3):
        b.endpoints[0].begin()  # worker 1 keeps endpoint 0 busy
    # Worker 0 has nothing in flight itself; on its own counts it would start at endpoint 0.
    picks = []
    for _ in range(3):
        ep = a.pick((), set())
        assert ep is not None
        ep.begin()
        picks.append(ep.index)
    assert picks == [1, 1, 1]
    assert a.pick((), set()) is not None and a.endpoints[0].gateway_in_flight == 3


def test_an_endpoint_past_the_table_counts_locally(tmp_path: Path) -> None:
    table = InFlightTable(tmp_path / "t", rows=1, cols=1, create=True)
    ep = SharedEndpoint(1, 8, table, 0)  # the pool grew past the table's columns
    ep.begin()
    assert ep.gateway_in_flight == 1 and table.row(0) == [0]


def _view(*endpoints: dict[str, Any]) -> dict[str, Any]:
    workers = [
        {"index": e["index"], "state": "ready" if e["available"] else "starting", "waiting": 2.0, "kv_cache_usage": 0.5}
        for e in endpoints
    ]
    status = {"backend": "pool", "kind": "vllm-pool", "workers": workers, "gateway_pid": 4242}
    return {"status": status, "endpoints": list(endpoints), "hopeless": False, "describe": "2 ready"}


def _ep(index: int, generation: int, available: bool = True, version: str | None = "0.11.0") -> dict[str, Any]:
    url = f"http://127.0.0.1:{9000 + index}/v1"
    return {"index": index, "url": url, "available": available, "generation": generation, "version": version}


async def test_client_follows_the_control_process_views(tmp_path: Path) -> None:
    client = VLLMPoolClient(pool_config("t", tmp_path), row=1)
    reported: list[tuple[int, int]] = []
    client.report_suspect = lambda index, generation: reported.append((index, generation))
    client.attach(str(InFlightTable(tmp_path / "t", 2, 2, create=True).path), 2, 2)
    client.apply(_view(_ep(0, 1), _ep(1, 0, available=False, version=None)))
    await client.start()
    try:
        eps = client.dispatcher.endpoints
        assert [ep.available for ep in eps] == [True, False]  # not ready yet: not routable
        first = eps[0].adapter
        assert isinstance(first, VLLMBackend)
        # The version the control process detected; no GET /version from this worker.
        assert first.version == VLLMVersion(0, 11, 0)
        assert eps[0].load.waiting == 2.0 and eps[0].load.kv_cache_usage == 0.5
        eps[0].prefixes.add([7])
        client.apply(_view(_ep(0, 1), _ep(1, 1)))
        assert eps[0].adapter is first and 7 in eps[0].prefixes  # same process: kept
        assert eps[1].available
        client.apply(_view(_ep(0, 2), _ep(1, 1)))  # vLLM 0 was restarted
        assert eps[0].adapter is not first and 7 not in eps[0].prefixes and eps[0].generation == 2
        # A call that cannot connect: out of this worker's routing now, and the control process is told.
        client._failed(eps[1], UpstreamTimeoutError("slow", reason="timeout"))
        assert eps[1].available and reported == []
        client._failed(eps[1], UpstreamConnectError("refused"))
        assert not eps[1].available and reported == [(1, 1)]
        status = client.pool_status()
        assert status.gateway_pid == 4242 and [w.in_flight for w in status.workers] == [0, 0]
    finally:
        await client.close()


# --- a multi-server vllm backend, found and probed once ----------------------------------------
async def test_a_multi_server_backend_is_probed_once_and_routed_by_every_worker(tmp_path: Path) -> None:
    """The control process's ``VLLMEndpointsBackend`` reads each server's version and probes it;
    two gateway workers route over what it publishes (no ``GET /version`` of their own), their
    calls counted in one table, and a server that goes away leaves their routing."""
    hits: dict[int, list[str]] = {}
    servers: list[web.AppRunner] = []
    ports = [free_port() for _ in range(2)]
    for port in ports:
        app = build_app(parse_args([MODEL, "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "1234"]))

        @web.middleware
        async def count(request: web.Request, handler: Any, port: int = port) -> web.StreamResponse:
            hits.setdefault(port, []).append(request.path)
            response: web.StreamResponse = await handler(request)
            return response

        app.middlewares.append(count)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        servers.append(runner)
    urls = ", ".join(f"http://127.0.0.1:{p}/v1" for p in ports)
    text = f"""
backends:
  - name: fleet
    type: vllm
    base_urls: [{urls}]
    routing: {{strategy: least-load, metrics_interval: 0.05, wait_for_ready: 2}}
    probe: {{interval: 0.05, timeout: 0.5, failures: 1}}
models:
  - {{name: m, routes: [{{backend: fleet, model: {MODEL}}}]}}
"""
    config = parse_config(text, "<shared>", env={})
    owner = PoolOwnership(shared_configs(config.backends), workers=2, workdir=tmp_path)
    feeds: list[PoolClients] = []
    await owner.start(lambda: [feed.apply(owner.frame()) for feed in feeds])
    gateways = []
    try:
        for row in range(2):
            built, feed = build_worker_backends(config.backends, row)
            assert isinstance(built["fleet"], VLLMEndpointsClient)
            feeds.append(feed)
            feed.apply(owner.frame())
            gateways.append(await serve_app(create_app(config, backends=built)))
        async with aiohttp.ClientSession() as session:
            answered = set()
            for _, url in gateways:
                for i in range(4):
                    body = {"model": "m", "prompt": f"p{i}", "max_tokens": 2}
                    async with session.post(url + "/v1/completions", json=body) as resp:
                        assert resp.status == 200, await resp.text()
                        answered.add((await resp.json())["choices"][0]["text"].split()[0])
            assert answered == {f"w{p}" for p in ports}
        assert [hits[p].count("/version") for p in ports] == [1, 1]  # the control process's only
        # What the servers' /v1/models says, read by the control process alone, known to every worker.
        assert [hits[p].count("/v1/models") for p in ports] == [1, 1]
        for feed in feeds:
            client = feed.clients["fleet"]
            assert client.context_length(MODEL) == 1234
            assert client.model_info(MODEL) == {"max_model_len": 1234, "root": MODEL}
        assert [hits[p].count("/v1/completions") for p in ports] == [4, 4]  # spread (idle: round-robin ties)
        status = owner.pools["fleet"].pool_status()
        assert [len(w.in_flight_by) for w in status.workers] == [2, 2]

        await servers[0].cleanup()  # a server goes away: the owner's probe fails, every worker stops routing to it
        servers.pop(0)
        for feed in feeds:
            eps = feed.clients["fleet"].dispatcher.endpoints
            await wait_for(lambda eps=eps: not eps[0].available, what="server 0 out of a worker's routing")
            assert eps[1].available
    finally:
        for runner, _ in gateways:
            await runner.cleanup()
        await owner.close()
        for runner in servers:
            await runner.cleanup()


async def test_the_score_inputs_reach_every_gateway_worker(tmp_path: Path) -> None:
    """With --workers N the control process scrapes; each worker scores on what its view says."""
    client = VLLMPoolClient(pool_config("t", tmp_path), row=0)
    view = _view(_ep(0, 1), _ep(1, 1))
    cache = {"block_size": 16, "num_gpu_blocks": 900, "prefix_caching": True, "hash_algo": "sha256"}
    for w in view["status"]["workers"]:
        w.update(running=3.0, cache=cache, scraped_in_flight=4, stale=w["index"] == 1)
    view["endpoints"][0]["events"] = "ipc:///tmp/x-0.sock"
    client.apply(view)
    await client.start()
    try:
        first, second = client.dispatcher.endpoints
        assert (first.load.block_size, first.load.hash_algo, first.load.in_flight) == (16, "sha256", 4)
        assert (first.load.running, first.load.stale, second.load.stale) == (3.0, False, True)
        assert first.events == "ipc:///tmp/x-0.sock" and second.events is None
        assert first.queue() == 2.0 + 3.0 - 4  # nothing of this worker's in flight: the scrape's, less ours then
    finally:
        await client.close()
