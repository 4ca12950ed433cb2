"""CPU of the Responses chat bridge's stream half against chat's, in process, no network: the same
vLLM chat stream (bench/fake_upstream.py's tokens, vLLM's chunk layout and a usage chunk) through
``VLLMChatStreamRelay`` for a chat client, and through the same relay for the bridge
(``BridgeChatCall``) then ``ChatResponseEvents``: the per-token and per-read work of each, what
issue 21's 1.15x is about once the request's fixed costs are set aside.

    .venv/bin/python bench/responses_relay.py                            # this checkout
    .venv/bin/python bench/responses_relay.py --ref /work/wt/baseline    # and another, in turns
    .venv/bin/python bench/responses_relay.py --per-event                # a read per event (a slow model)

The figure is process CPU time (``time.process_time``) per stream, the median of ``--rounds``
rounds, chat and bridge in turns within each, and what the bridge costs over chat in the same
process (processes differ by more than that: compare checkouts by it, or by the ratio). ``--ref``:
this script runs again over the other checkout's code in a process of its own, the two in turns
(``--runs`` processes each, the medians of their figures printed).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson

HEAD = {"id": "chatcmpl-0123456789abcdef0123456789abcdef", "object": "chat.completion.chunk", "created": 1796164191}
MODEL = "org/tiny"


def chat_stream(tokens: int) -> list[bytes]:
    """vLLM's chat stream of ``tokens`` tokens (role in the first delta, a finish, a usage chunk), one item an event."""
    events = []
    for i in range(tokens):
        delta = {"role": "assistant", "content": f" tok{i}"} if i == 0 else {"content": f" tok{i}"}
        finish = "length" if i == tokens - 1 else None
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        events.append(b"data: " + orjson.dumps({**HEAD, "model": MODEL, "choices": [choice]}) + b"\n\n")
    usage = {"prompt_tokens": 5, "completion_tokens": tokens, "total_tokens": tokens + 5}
    events.append(b"data: " + orjson.dumps({**HEAD, "model": MODEL, "choices": [], "usage": usage}) + b"\n\n")
    return [*events, b"data: [DONE]\n\n"]


class Reads:
    """An ``UpstreamResponse`` of scripted reads."""

    status = 200

    def __init__(self, reads: list[bytes]) -> None:
        self._reads = reads

    def header(self, name: str) -> str | None:
        return None

    async def read(self) -> bytes:
        raise AssertionError("streams are read chunk by chunk")

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        for read in self._reads:
            yield read

    def release(self) -> None:
        pass


def measure(tokens: int, per_event: bool, streams: int, rounds: int) -> dict[str, float]:
    from types import SimpleNamespace

    from backends.base import BridgeChatCall, ChatCall, ResponsesCall
    from backends.openai.wire import OpenAIWire
    from backends.responses.bridge import chat_call_of
    from backends.responses.events import ChatResponseEvents
    from backends.vllm.stream import VLLMChatStreamRelay
    from schemas.chat import ChatCompletionRequest
    from schemas.responses import ResponsesRequest

    wire: Any = SimpleNamespace(backend="bench", max_event=1 << 20)  # what OpenAIWire.relay reads of its wire
    events = chat_stream(tokens)
    reads = events if per_event else [b"".join(events)]
    limit = {"max_output_tokens": tokens}
    request = ResponsesRequest.model_validate({"model": "pub", "input": "hi there", "stream": True, **limit})
    chat, frame = chat_call_of(ResponsesCall(request, MODEL, "pub", "r"))
    bridge = BridgeChatCall(chat.request, MODEL, "pub", "r")
    messages = [{"role": "user", "content": "hi there"}]  # a chat client's request of the same limit
    plain = ChatCompletionRequest.model_validate(
        {"model": "pub", "messages": messages, "max_tokens": tokens, "stream": True}
    )
    client = ChatCall(plain, MODEL, "pub", "r")

    async def chat_once() -> None:
        async for _ in OpenAIWire.relay(wire, VLLMChatStreamRelay, Reads(reads), client):  # type: ignore[arg-type]
            pass

    async def bridge_once() -> None:
        relay = OpenAIWire.relay(wire, VLLMChatStreamRelay, Reads(reads), bridge)  # type: ignore[arg-type]
        async for _ in ChatResponseEvents(relay, frame, "bench"):
            pass

    async def run() -> dict[str, float]:
        kinds = {"chat": chat_once, "bridge": bridge_once}
        for once in kinds.values():  # warm up
            for _ in range(100):
                await once()
        cpu: dict[str, list[float]] = {name: [] for name in kinds}
        for i in range(rounds):
            for name, once in kinds.items() if i % 2 == 0 else reversed(kinds.items()):
                start = time.process_time()
                for _ in range(streams):
                    await once()
                cpu[name].append((time.process_time() - start) / streams * 1e6)
        return {name: statistics.median(values) for name, values in cpu.items()}

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ref", help="another checkout, measured by this script in a process of its own")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--per-event", action="store_true", help="a read per event, not the stream in one read")
    parser.add_argument("--streams", type=int, default=300, help="streams per round and kind")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--runs", type=int, default=3, help="with --ref: processes per checkout, in turns")
    parser.add_argument("--root", help=argparse.SUPPRESS)  # the checkout whose code is measured (for --ref)
    args = parser.parse_args()
    if args.root is not None:  # one measurement, of --root's code, printed for the parent
        sys.path.insert(0, args.root)
        print(orjson.dumps(measure(args.tokens, args.per_event, args.streams, args.rounds)).decode())
        return
    roots = {"this": str(Path(__file__).resolve().parent.parent)}
    if args.ref:
        roots["ref"] = str(Path(args.ref).resolve())
    rest = ["--tokens", str(args.tokens), "--streams", str(args.streams), "--rounds", str(args.rounds)]
    rest += ["--per-event"] if args.per_event else []
    results: dict[str, list[dict[str, float]]] = {name: [] for name in roots}
    for _ in range(args.runs if args.ref else 1):
        for name, root in roots.items():
            argv = [sys.executable, __file__, "--root", root, *rest]
            results[name].append(orjson.loads(subprocess.run(argv, check=True, capture_output=True).stdout))
    shape = "a read per event" if args.per_event else "one read"
    print(f"# a {args.tokens}-token vLLM chat stream, {shape}: CPU us per stream; load {os.getloadavg()[0]:.2f}")
    for name, runs in results.items():
        chat = statistics.median(run["chat"] for run in runs)
        bridge = statistics.median(run["bridge"] for run in runs)
        extra = statistics.median(run["bridge"] - run["chat"] for run in runs)
        print(f"{name}: chat relay {chat:.1f}, bridge (relay + Responses events) {bridge:.1f}", end="")
        print(f" ({bridge / chat:.2f}x, {extra:.1f} over chat)")


if __name__ == "__main__":
    main()
