"""Keep-alive client load for the reload and rollout tests: N connections, one request after another.

Half the requests stream (alternating per connection); a request fails when its status is not
200 or a stream does not end in ``data: [DONE]`` without an error event.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import aiohttp

__all__ = ["Tally", "client", "load"]


@dataclass
class Tally:
    ok: int = 0
    failures: list[str] = field(default_factory=list)


async def client(url: str, n: int, tally: Tally, stop: asyncio.Event, *, max_tokens: int = 4) -> None:
    """One keep-alive connection sending requests to ``url`` until ``stop`` is set."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
        i = 0
        while not stop.is_set():
            stream = (n + i) % 2 == 0
            i += 1
            body = {"model": "m", "prompt": "x", "max_tokens": max_tokens, "stream": stream}
            try:
                async with session.post(url + "/v1/completions", json=body) as resp:
                    raw = await resp.read()
            except (TimeoutError, aiohttp.ClientError) as exc:
                tally.failures.append(f"{type(exc).__name__}: {exc}")
                continue
            if resp.status != 200 or (stream and (not raw.endswith(b"data: [DONE]\n\n") or b'"error"' in raw)):
                tally.failures.append(f"status {resp.status}: {raw[-200:]!r}")
            else:
                tally.ok += 1


@asynccontextmanager
async def load(url: str, clients: int = 6, *, max_tokens: int = 4) -> AsyncIterator[Tally]:
    """``clients`` connections of :func:`client` while the block runs; their tally."""
    tally, stop = Tally(), asyncio.Event()
    tasks = [asyncio.create_task(client(url, n, tally, stop, max_tokens=max_tokens)) for n in range(clients)]
    try:
        yield tally
    finally:
        stop.set()
        await asyncio.gather(*tasks)
