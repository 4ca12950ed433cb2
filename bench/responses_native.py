"""CPU of what a Responses stream from an ``openai`` backend adds in process, without the network:
the native relay of OpenAI's events (``backends/responses/native_events.py``) and the store's save
of the finished turn (``gateway/conversations``, memory store).

    .venv/bin/python bench/responses_native.py                          # this checkout
    .venv/bin/python bench/responses_native.py --ref /work/wt/baseline  # and another one's, in turns

``relay, one read``: bench/fake_upstream.py's stream of ``--tokens`` text deltas and its nine
other events in one read, as a fast upstream's arrive (what ``bench/request_cost.py`` drives);
``relay, a read per event``: the same stream an event a read, as a model's tokens arrive;
``save``: a first turn (a string input, the finished Response) saved by the Responses hook, as
after every stream with ``store`` true. Each checkout runs in its own process (``--ref``: that
checkout's ``.venv``, its own code), the two taking turns in every round; the figure is process CPU
time (``time.process_time``) per stream or turn, the median of ``--rounds`` rounds, and the
median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CASES = ("relay, one read", "relay, a read per event", "save")


def child(tokens: int, count: int) -> None:
    """In the checkout's own process: one round of every case, as JSON (us per stream or turn)."""
    sys.path[:0] = [os.getcwd(), str(HERE)]
    import asyncio

    import orjson
    from fake_upstream import Renderer

    from backends.base import ResponsesCall
    from backends.responses.native import NativeResponseEvents
    from gateway.conversations import ConversationStore
    from gateway.flow.responses_turns import ResponsesTurns
    from gateway.store import MemoryStore
    from schemas.responses import ResponsesRequest
    from tests.backends.openai.test_openai_relay import FakeResponse

    def unchunked(chunk: bytes) -> bytes:
        size, rest = chunk.split(b"\r\n", 1)
        return rest[: int(size, 16)]

    events = [unchunked(chunk) for chunk in Renderer().responses_stream("bench", tokens, 7)]
    body = {"model": "bench", "input": "Say something about benchmarks please", "max_output_tokens": tokens}
    request = ResponsesRequest.model_validate({**body, "stream": True})
    call = ResponsesCall(request, "bench", "bench", "bench")
    store = ConversationStore(MemoryStore("responses", ttl=3600, max_items=10_000, max_bytes=1 << 30))
    turns = ResponsesTurns()

    async def relay(reads: list[bytes]) -> Any:
        stream = NativeResponseEvents(FakeResponse(reads), call, "bench")  # type: ignore[arg-type]
        async for _ in stream:
            pass
        return stream

    final = asyncio.run(relay(events))
    answer = orjson.loads(orjson.dumps(final.final))

    async def run() -> dict[str, float]:
        out = {}
        for case in CASES:
            start = time.process_time()
            for i in range(count):
                if case == "save":
                    await turns.end(request, {**answer, "id": f"resp_{i}"}, store, None)
                else:
                    await relay([b"".join(events)] if case == "relay, one read" else events)
            out[case] = (time.process_time() - start) / count * 1e6
        return out

    asyncio.run(run())  # warm up
    print(json.dumps(asyncio.run(run())))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ref", help="another checkout (with its .venv), measured beside this one")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--count", type=int, default=500, help="streams (turns) per case and round")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.tokens, args.count)
        return
    checkouts = {"this": HERE.parent} | ({"ref": Path(args.ref).resolve()} if args.ref else {})
    figures: dict[str, dict[str, list[float]]] = {name: {case: [] for case in CASES} for name in checkouts}
    for i in range(args.rounds):
        for name in list(checkouts) if i % 2 == 0 else reversed(list(checkouts)):
            checkout = checkouts[name]
            argv = [str(checkout / ".venv" / "bin" / "python"), str(Path(__file__).resolve()), "--child"]
            argv += ["--tokens", str(args.tokens), "--count", str(args.count)]
            env = {**os.environ, "PYTHONPATH": str(checkout)}
            result = json.loads(subprocess.run(argv, cwd=checkout, env=env, capture_output=True, check=True).stdout)
            for case in CASES:
                figures[name][case].append(result[case])
    print(f"# {args.tokens}-token Responses stream, CPU us (median of {args.rounds}); load {os.getloadavg()[0]:.2f}")
    print("| case | " + " | ".join(checkouts) + (" | this / ref |" if args.ref else " |"))
    print("|---" * (len(checkouts) + 1 + bool(args.ref)) + "|")
    for case in CASES:
        cells = [f"{statistics.median(figures[name][case]):.1f}" for name in checkouts]
        if args.ref:
            ratios = [a / b for a, b in zip(figures["this"][case], figures["ref"][case], strict=True)]
            cells.append(f"{statistics.median(ratios):.2f}x")
        print(f"| {case} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
