"""Micro-benchmark: the gateway writing ``base64`` embeddings where the server answered floats.

    .venv/bin/python bench/base64_vectors.py [--rows 256] [--dims 1024] [--repeats 200]

Times :func:`backends.emulation.vectors.base64_vectors` (floats to little-endian float32 to
base64) and the answer's body around it (:func:`~backends.emulation.vectors.embedding_list`) on a
``rows`` x ``dims`` batch of float32 values, as an upstream's parsed JSON holds them. Reports the
median and the fastest of ``--repeats`` runs, CPU time (``process_time``: what a busy machine's
other processes disturb least) and wall time, next to a baseline measured in the same run: the
stdlib's plain way (``struct.pack`` of each row, ``base64.b64encode``, ``str``, ``orjson.dumps``).
The output decodes to the input exactly (checked first). The target: the conversion of a
256 x 1,024 batch under 2 ms.
"""

from __future__ import annotations

import argparse
import base64
import os
import random
import statistics
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends.base import TokenUsage
from backends.emulation.vectors import base64_vectors, embedding_list

USAGE = TokenUsage(256, 0)


def gateway(rows: list[list[float]]) -> bytes:
    return embedding_list(base64_vectors(rows, "bench"), "bench", USAGE)


def gateway_encode_only(rows: list[list[float]]) -> list[bytes]:
    return base64_vectors(rows, "bench")


def plain(rows: list[list[float]]) -> bytes:
    """The baseline: each row packed, base64 as str, the answer serialised by orjson."""
    vectors = [base64.b64encode(struct.pack(f"<{len(r)}f", *r)).decode("ascii") for r in rows]
    data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
    usage = {"prompt_tokens": USAGE.prompt_tokens, "total_tokens": USAGE.prompt_tokens}
    return orjson.dumps({"object": "list", "data": data, "model": "bench", "usage": usage})


def timed(func: Callable[[list[list[float]]], Any], rows: list[list[float]], repeats: int) -> dict[str, float]:
    cpu, wall = [], []
    for _ in range(repeats):
        c, w = time.process_time(), time.perf_counter()
        func(rows)
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    return {
        "cpu_median_ms": statistics.median(cpu) * 1e3,
        "cpu_min_ms": min(cpu) * 1e3,
        "wall_median_ms": statistics.median(wall) * 1e3,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--dims", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=200)
    args = ap.parse_args()
    rng = random.Random(7)
    packer = struct.Struct(f"<{args.dims}f")
    rows = [
        list(packer.unpack(packer.pack(*(rng.uniform(-0.1, 0.1) for _ in range(args.dims))))) for _ in range(args.rows)
    ]
    answer = orjson.loads(gateway(rows))
    decoded = [list(packer.unpack(base64.b64decode(d["embedding"]))) for d in answer["data"]]
    assert decoded == rows, "base64 does not decode to the floats"
    assert answer == orjson.loads(plain(rows))
    print(f"# {args.rows} x {args.dims} floats, {args.repeats} repeats; load average {os.getloadavg()[0]:.2f}")
    print("| what | CPU median ms | CPU fastest ms | wall median ms |")
    print("|---|---|---|---|")
    for name, func in (
        ("plain (baseline)", plain),
        ("gateway: body", gateway),
        ("gateway: base64 only", gateway_encode_only),
    ):
        t = timed(func, rows, args.repeats)
        print(f"| {name} | {t['cpu_median_ms']:.2f} | {t['cpu_min_ms']:.2f} | {t['wall_median_ms']:.2f} |")


if __name__ == "__main__":
    main()
