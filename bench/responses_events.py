"""CPU of the Responses chat bridge's stream half alone: one chat stream of ``--tokens`` text
events (one read, as a fast upstream's arrive) written as Responses events
(``backends/responses/events.py``), in this process, no network.

    .venv/bin/python bench/responses_events.py                          # this checkout
    .venv/bin/python bench/responses_events.py --ref /work/wt/baseline  # and another one's events.py

``--ref``: that checkout's ``backends/responses/events.py`` (with the modules it writes with,
where it has them: ``response_writer``, ``lifecycle_bytes``, ``text_run``, ``event_stream``) is
loaded beside this one's (the rest of the package is this checkout's), and the two take turns in
every round. The figure is process CPU time (``time.process_time``) per stream, the median of
``--rounds`` rounds, so other processes on the machine move it little; ``bench/request_cost.py``
gives the whole request's.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backends.base import CompletionStream, ResponsesCall
from backends.responses import events as this_events
from backends.responses.bridge import chat_call_of
from schemas.responses import ResponsesRequest

HEAD = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1796164191, "model": "bench"}


def chat_stream(tokens: int) -> bytes:
    """What the gateway's chat relay gives the bridge for bench/fake_upstream.py's stream."""
    out = []
    for i in range(tokens):
        delta = {"role": "assistant", "content": f" tok{i}"} if i == 0 else {"content": f" tok{i}"}
        finish = "length" if i == tokens - 1 else None
        choice = {"delta": delta, "index": 0, "logprobs": None, "finish_reason": finish}
        out.append(b"data: " + orjson.dumps({**HEAD, "choices": [choice], "usage": None}) + b"\n\n")
    usage = {"prompt_tokens": 2, "completion_tokens": tokens, "total_tokens": tokens + 2}
    out.append(b"data: " + orjson.dumps({**HEAD, "choices": [], "usage": usage}) + b"\n\n")
    return b"".join(out)


class OneRead(CompletionStream):
    def __init__(self, data: bytes) -> None:
        self._data: bytes | None = data

    async def __anext__(self) -> bytes:
        if self._data is None:
            raise StopAsyncIteration
        data, self._data = self._data, None
        self.finished = True
        return data

    async def aclose(self) -> None:
        pass


# The modules events.py writes with (where the checkout has them): the ref's own, not this one's.
HELPERS = ("event_stream", "lifecycle_bytes", "text_run", "response_writer")


def load_module(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_events(checkout: str) -> ModuleType:
    folder = Path(checkout) / "backends" / "responses"
    saved = {name: sys.modules.get(name) for name in (f"backends.responses.{helper}" for helper in HELPERS)}
    try:
        for helper in HELPERS:
            if (folder / f"{helper}.py").exists():
                load_module(f"backends.responses.{helper}", folder / f"{helper}.py")
        return load_module("ref_events", folder / "events.py")
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


async def one(module: ModuleType, frame: Any, data: bytes) -> int:
    size = 0
    async for piece in module.ChatResponseEvents(OneRead(data), frame, "bench"):
        size += len(piece)
    return size


async def measure(modules: dict[str, ModuleType], tokens: int, streams: int, rounds: int) -> dict[str, float]:
    request = ResponsesRequest.model_validate(
        {"model": "bench", "input": "hi there", "max_output_tokens": tokens, "stream": True}
    )
    _, frame = chat_call_of(ResponsesCall(request, "bench", "bench", "bench"))
    data = chat_stream(tokens)
    for module in modules.values():  # warm up; the same bytes out of each
        for _ in range(50):
            await one(module, frame, data)
    cpu: dict[str, list[float]] = {name: [] for name in modules}
    for i in range(rounds):
        order = list(modules.items()) if i % 2 == 0 else list(reversed(modules.items()))
        for name, module in order:
            start = time.process_time()
            for _ in range(streams):
                await one(module, frame, data)
            cpu[name].append((time.process_time() - start) / streams * 1e6)
    return {name: statistics.median(values) for name, values in cpu.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ref", help="another checkout, whose backends/responses/events.py runs beside this one's")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--streams", type=int, default=500, help="streams per round and module")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    modules = {"this": this_events}
    if args.ref:
        modules["ref"] = load_events(args.ref)
    result = asyncio.run(measure(modules, args.tokens, args.streams, args.rounds))
    load = os.getloadavg()[0]
    print(
        f"# Responses events of a {args.tokens}-token chat stream, CPU us per stream "
        f"(median of {args.rounds}); load {load:.2f}"
    )
    for name, value in result.items():
        print(f"{name}: {value:.1f}")
    if "ref" in result:
        print(f"this / ref: {result['this'] / result['ref']:.2f}x")


if __name__ == "__main__":
    main()
