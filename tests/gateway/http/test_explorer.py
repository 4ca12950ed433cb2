"""``GET /docs``: the API explorer is served by the gateway from the pinned package (nothing from another
host), and the OpenAPI document it shows covers every route the gateway serves, ``/ready`` included."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import aiohttp
from swagger_ui_bundle import swagger_ui_path  # type: ignore[import-untyped]

from gateway.app import create_app
from gateway.configfile import parse_config
from tests.conftest import RunningGateway, serve_app

CONFIG = "backends: [{name: s, type: mock}]\nmodels: [{name: m, routes: [{backend: s, model: m}]}]\n"


async def test_the_page_and_every_file_it_loads_come_from_the_gateway(gateway: RunningGateway) -> None:
    async with aiohttp.ClientSession(auto_decompress=True) as session:
        async with session.get(gateway.url + "/docs") as resp:
            assert resp.status == 200 and resp.content_type == "text/html"
            page = await resp.text()
        loaded = re.findall(r'(?:src|href)="([^"]+)"', page)
        assert loaded and all(not re.match(r"\w+:|//", url) for url in loaded), loaded  # no CDN, no other host
        for url in loaded:
            async with session.get(f"{gateway.url}/{url}") as resp:
                assert resp.status == 200, url
                body = await resp.read()
            name = url.rsplit("/", 1)[1]
            if name != "explorer.js":
                assert body == (Path(str(swagger_ui_path)) / name).read_bytes(), name
        async with session.get(gateway.url + "/docs/explorer.js") as resp:
            assert 'url: "openapi.json"' in await resp.text()
        async with session.get(gateway.url + "/docs/index.html") as resp:
            assert resp.status == 404  # only what the page uses
        headers = {"Accept-Encoding": "gzip"}
        async with session.get(gateway.url + "/docs/swagger-ui-bundle.js", headers=headers, auto_decompress=False) as r:
            assert r.headers["Content-Encoding"] == "gzip"
            packed = await r.read()
    bundle = (Path(str(swagger_ui_path)) / "swagger-ui-bundle.js").read_bytes()
    assert gzip.decompress(packed) == bundle and len(packed) < len(bundle) / 2


async def test_the_document_covers_every_route() -> None:
    app = create_app(parse_config(CONFIG, env={}))
    served = {
        (route.method, route.resource.get_info().get("path") or route.resource.get_info()["formatter"])
        for route in app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    }
    served.discard(("GET", "/docs/{name}"))  # the explorer's own files, not API
    runner, url = await serve_app(app)
    try:
        async with aiohttp.ClientSession() as session, session.get(url + "/openapi.json") as resp:
            doc = await resp.json()
    finally:
        await runner.cleanup()
    described = {(method.upper(), path) for path, operations in doc["paths"].items() for method in operations}
    assert described == served
    assert {"/ready", "/docs", "/v1/responses", "/v1/embeddings", "/v1/rerank", "/tokenize"} <= set(doc["paths"])
    ids = [op["operationId"] for operations in doc["paths"].values() for op in operations.values()]
    assert len(ids) == len(set(ids))  # each operation its own id, aliases included
    assert all(word in doc["info"]["description"] for word in ("Chat Completions", "Responses", "embeddings", "rerank"))


async def test_the_explorer_can_be_turned_off() -> None:
    config = parse_config("server: {api_explorer: false}\n" + CONFIG, env={})
    runner, url = await serve_app(create_app(config))
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(url + "/docs") as resp:
                assert resp.status == 404
            async with session.get(url + "/openapi.json") as resp:
                assert "/docs" not in (await resp.json())["paths"]
    finally:
        await runner.cleanup()
