"""A shared-prefix load against a running gateway: throughput, TTFT, routing decisions.

Used by ``bench/pool_sim.py`` (stand-in workers) and ``deploy/gpu-check.sh`` (real vLLM).
``--concurrency`` closed-loop clients send ``--requests`` streaming completions in all;
each prompt is one of ``--groups`` shared prefixes (``--prefix-chars`` long, picked
uniformly with ``--seed``) plus a unique suffix, the shape of many users sharing a few
system prompts or documents. TTFT is from sending the request to the first SSE event
carrying text. The affinity hit rate comes from the gateway's
``gateway_pool_routing_decisions_total``: hits / (hits + misses + overloaded fallbacks),
counted over this run only; with ``prefix-hash`` the preferred rate is the share of
requests that went to their prefix's first rendezvous choice (the rest spilled past the
load bound).

    python bench/pool_load.py --url http://127.0.0.1:8080 --model llama --requests 300
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import time
from dataclasses import asdict, dataclass

import aiohttp

WORDS = "the of and to in is that for it as with was on be by this are from or have an not which at".split()
_DECISION = re.compile(r'^gateway_pool_routing_decisions_total\{backend="([^"]+)",decision="([^"]+)"\} ([0-9.e+]+)$')


@dataclass
class LoadResult:
    requests: int
    errors: int
    seconds: float
    rps: float
    ttft_p50_ms: float
    ttft_p90_ms: float
    ttft_p99_ms: float
    latency_p50_ms: float
    latency_p90_ms: float
    affinity_hit_rate: float | None
    decisions: dict[str, float]
    hash_preferred_rate: float | None = None


def prefixes(groups: int, chars: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        text = f"[shared context {g}] "
        while len(text) < chars:
            text += rng.choice(WORDS) + " "
        out.append(text[:chars])
    return out


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000


async def _decisions(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(f"{url}/metrics") as resp:
        text = await resp.text()
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = _DECISION.match(line)
        if match:
            out[match.group(2)] = out.get(match.group(2), 0.0) + float(match.group(3))
    return out


async def run_load(
    url: str,
    model: str,
    *,
    requests: int,
    concurrency: int,
    groups: int,
    prefix_chars: int,
    max_tokens: int,
    seed: int,
) -> LoadResult:
    shared = prefixes(groups, prefix_chars, seed)
    rng = random.Random(seed + 1)
    plan = [(rng.randrange(groups), i) for i in range(requests)]
    ttfts: list[float] = []
    latencies: list[float] = []
    errors = 0
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        before = await _decisions(session, url)

        async def one(group: int, i: int) -> None:
            nonlocal errors
            body = {
                "model": model,
                "prompt": shared[group] + f" Request {i}: please answer briefly.",
                "max_tokens": max_tokens,
                "temperature": 0,
                "stream": True,
            }
            started = time.perf_counter()
            first: float | None = None
            try:
                async with session.post(f"{url}/v1/completions", json=body) as resp:
                    if resp.status != 200:
                        errors += 1
                        await resp.read()
                        return
                    async for line in resp.content:
                        if first is None and line.startswith(b"data: {") and b'"text"' in line:
                            first = time.perf_counter() - started
                        if b'"error"' in line:
                            errors += 1
                            return
            except aiohttp.ClientError:
                errors += 1
                return
            latencies.append(time.perf_counter() - started)
            if first is not None:
                ttfts.append(first)

        queue = list(reversed(plan))

        async def client() -> None:
            while queue:
                group, i = queue.pop()
                await one(group, i)

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        seconds = time.perf_counter() - started
        after = await _decisions(session, url)
    decisions = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    affine = sum(decisions.get(k, 0.0) for k in ("affinity_hit", "affinity_miss", "affinity_overloaded"))
    hashed = decisions.get("hash_preferred", 0.0) + decisions.get("hash_overloaded", 0.0)
    return LoadResult(
        requests=requests,
        errors=errors,
        seconds=seconds,
        rps=len(latencies) / seconds,
        ttft_p50_ms=_pct(ttfts, 0.5),
        ttft_p90_ms=_pct(ttfts, 0.9),
        ttft_p99_ms=_pct(ttfts, 0.99),
        latency_p50_ms=_pct(latencies, 0.5),
        latency_p90_ms=_pct(latencies, 0.9),
        affinity_hit_rate=decisions.get("affinity_hit", 0.0) / affine if affine else None,
        decisions=decisions,
        hash_preferred_rate=decisions.get("hash_preferred", 0.0) / hashed if hashed else None,
    )


def add_load_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=24)
    parser.add_argument("--groups", type=int, default=16, help="distinct shared prefixes")
    parser.add_argument("--prefix-chars", type=int, default=2048)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--seed", type=int, default=7)


def summary(result: LoadResult) -> str:
    hit = "-" if result.affinity_hit_rate is None else f"{result.affinity_hit_rate:.1%}"
    rate = result.hash_preferred_rate
    preferred = "" if rate is None else f"; prefix-hash preferred {rate:.1%}"
    scored = {k.removeprefix("score_"): int(v) for k, v in result.decisions.items() if k.startswith("score_") and v}
    decided = "" if not scored else "; score decided by " + ", ".join(f"{k} {v}" for k, v in scored.items())
    return (
        f"{result.requests} requests ({result.errors} errors) in {result.seconds:.1f}s: {result.rps:.1f} req/s; "
        f"TTFT p50 {result.ttft_p50_ms:.0f} ms, p90 {result.ttft_p90_ms:.0f} ms, p99 {result.ttft_p99_ms:.0f} ms; "
        f"latency p50 {result.latency_p50_ms:.0f} ms; prefix-affinity hit rate {hit}{preferred}{decided}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="the gateway, e.g. http://127.0.0.1:8080")
    parser.add_argument("--model", required=True, help="a model name the gateway serves")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line")
    add_load_args(parser)
    args = parser.parse_args()
    result = asyncio.run(
        run_load(
            args.url.rstrip("/"),
            args.model,
            requests=args.requests,
            concurrency=args.concurrency,
            groups=args.groups,
            prefix_chars=args.prefix_chars,
            max_tokens=args.max_tokens,
            seed=args.seed,
        )
    )
    print(json.dumps(asdict(result)) if args.json else summary(result))


if __name__ == "__main__":
    main()
