"""The thinnest reasonable Python proxy: an aiohttp pass-through with no validation.

A reference row for the benchmark, not the product: no routing, auth, retries,
limits or metrics. Bodies are relayed as bytes; streams chunk by chunk as they arrive.

  python bench/thin_proxy.py --port 18003 --upstream http://127.0.0.1:18001
"""

from __future__ import annotations

import argparse
import ipaddress
import sys
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "te", "trailer", "upgrade"}
SESSION = web.AppKey("session", ClientSession)


def make_app(upstream: str) -> web.Application:
    app = web.Application()

    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        connector = TCPConnector(limit=0, ttl_dns_cache=None)
        async with ClientSession(
            connector=connector, timeout=ClientTimeout(total=None, sock_read=600), auto_decompress=False
        ) as session:
            app[SESSION] = session
            yield

    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        url = upstream + request.rel_url.path_qs
        async with request.app[SESSION].request(request.method, url, data=body, headers=headers) as up:
            out_headers = {k: v for k, v in up.headers.items() if k.lower() not in HOP}
            if not up.headers.get("Content-Type", "").startswith("text/event-stream"):
                return web.Response(status=up.status, body=await up.read(), headers=out_headers)
            resp = web.StreamResponse(status=up.status, headers=out_headers)
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    app.router.add_route("*", "/{tail:.*}", relay)
    app.cleanup_ctx.append(session_ctx)
    return app


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=18003)
    ap.add_argument("--upstream", default="http://127.0.0.1:18001", help="upstream root (no /v1)")
    args = ap.parse_args()
    if not all(ipaddress.ip_address(h or "").is_loopback for h in (args.host, urlsplit(args.upstream).hostname)):
        sys.exit("thin_proxy: loopback addresses only")
    import uvloop

    web.run_app(
        make_app(args.upstream.rstrip("/")),
        host=args.host,
        port=args.port,
        access_log=None,
        print=None,
        loop=uvloop.new_event_loop(),
    )


if __name__ == "__main__":
    main()
