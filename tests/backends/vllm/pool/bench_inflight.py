"""Cost of the shared in-flight table per request: one least-load pick plus begin/end, plain vs shared.

Run: ``.venv/bin/python -m tests.backends.vllm.pool.bench_inflight`` (not a test; prints microseconds,
the best of 5 x 20,000 rounds; on a busy box compare runs, not single figures).
"""

import tempfile
import timeit
from collections.abc import Callable
from pathlib import Path

from backends.vllm.routing.balancer import Balancer, Endpoint
from backends.vllm.routing.inflight import InFlightTable, SharedEndpoint
from schemas.config import PoolRoutingConfig

ROUTING = PoolRoutingConfig(strategy="least-load")


def run(make: Callable[[int], Endpoint], n_ep: int) -> float:
    b = Balancer(ROUTING)
    for i in range(n_ep):
        ep = make(i)
        ep.url, ep.available = f"http://h:{i}/v1", True
        b.endpoints.append(ep)
    none: set[tuple[int, int]] = set()

    def one() -> None:
        ep = b.pick((), none)
        assert ep is not None
        ep.begin()
        ep.end()

    return min(timeit.repeat(one, number=20000, repeat=5)) / 20000 * 1e6


def main() -> None:
    d = Path(tempfile.mkdtemp())
    for n_ep in (2, 8):
        row = [f"endpoints={n_ep}: plain {run(lambda i: Endpoint(i, 8), n_ep):.2f} us"]
        for rows in (2, 4, 16):
            t = InFlightTable(d / f"t{n_ep}-{rows}", rows, n_ep, create=True)
            row.append(f"shared N={rows} {run(lambda i, t=t: SharedEndpoint(i, 8, t, 1), n_ep):.2f} us")
        print("; ".join(row))


if __name__ == "__main__":
    main()
