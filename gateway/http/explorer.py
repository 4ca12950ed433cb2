"""``GET /docs``: an API explorer (Swagger UI) over ``/openapi.json``, every endpoint the gateway serves.

The page and its scripts come from the pinned ``swagger-ui-bundle-v2`` package (Swagger UI 5, which reads
OpenAPI 3.1; the original ``swagger-ui-bundle`` ships 4.15, which cannot), served by the gateway
itself: the browser fetches nothing from a CDN or any other host, so it works on an air-gapped network
and under a strict CSP. Only the files the page uses are served (``/docs/{name}``), read once and kept
with their gzip form; URLs are relative, so the explorer works behind a proxy that adds a path prefix.
With auth on, ``/openapi.json`` lists what an anonymous caller may see, and "Authorize" takes a key.
"""

from __future__ import annotations

import functools
import gzip
from pathlib import Path

from aiohttp import web

__all__ = ["add_explorer_routes"]

# name -> content type: what the page loads, nothing else of the package's folder.
_ASSETS = {
    "swagger-ui.css": "text/css",
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui-standalone-preset.js": "text/javascript",
    "favicon-32x32.png": "image/png",
    "favicon-16x16.png": "image/png",
    "explorer.js": "text/javascript",  # ours: the start-up script, not inline (a CSP may forbid inline scripts)
}
_CACHE = "public, max-age=86400"  # the files change only with the pinned package

_PAGE = b"""<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>completions-gateway API</title>
  <link rel="stylesheet" href="docs/swagger-ui.css">
  <link rel="icon" type="image/png" href="docs/favicon-32x32.png" sizes="32x32">
  <link rel="icon" type="image/png" href="docs/favicon-16x16.png" sizes="16x16">
</head>
<body>
  <div id="swagger-ui"></div>
  <script src="docs/swagger-ui-bundle.js"></script>
  <script src="docs/swagger-ui-standalone-preset.js"></script>
  <script src="docs/explorer.js"></script>
</body>
</html>
"""

_SCRIPT = b"""window.addEventListener("load", function () {
  window.ui = SwaggerUIBundle({
    url: "openapi.json",
    dom_id: "#swagger-ui",
    deepLinking: true,
    presets: [SwaggerUIBundle.presets.apis, SwaggerUIStandalonePreset],
    layout: "StandaloneLayout",
    validatorUrl: null
  });
});
"""


def _bundle_folder() -> Path:
    # Imported on first use: a gateway never asked pays nothing. The package ships no type marker.
    from swagger_ui_bundle import swagger_ui_path  # type: ignore[import-untyped]

    return Path(str(swagger_ui_path))


@functools.cache
def _asset(name: str) -> tuple[bytes, bytes]:
    """A file's bytes and their gzip form (read once per process)."""
    data = _SCRIPT if name == "explorer.js" else (_bundle_folder() / name).read_bytes()
    return data, gzip.compress(data, 6)


async def _page(request: web.Request) -> web.Response:
    return web.Response(body=_PAGE, content_type="text/html", charset="utf-8")


async def _file(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    content_type = _ASSETS.get(name)
    if content_type is None:
        raise web.HTTPNotFound()
    data, packed = _asset(name)
    headers = {"Cache-Control": _CACHE, "Vary": "Accept-Encoding"}
    if "gzip" in request.headers.get("Accept-Encoding", "") and not content_type.startswith("image/"):
        headers["Content-Encoding"] = "gzip"
        data = packed
    return web.Response(body=data, content_type=content_type, headers=headers)


def add_explorer_routes(app: web.Application) -> None:
    """``GET /docs`` and the files it loads, ``GET /docs/{name}``."""
    app.router.add_get("/docs", _page)
    app.router.add_get("/docs/{name}", _file)
