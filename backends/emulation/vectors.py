"""Embedding answers the gateway writes itself: float vectors as OpenAI's base64, batches split and joined.

- :func:`base64_vectors`: each vector as little-endian float32 bytes, base64 (what OpenAI's
  ``encoding_format: "base64"`` means and what the openai SDK decodes), for upstreams that
  answer floats only. ``struct`` packs each row's Python floats, ``binascii`` encodes them; no numpy.
- :func:`embedding_list`: OpenAI's ``list`` object from vectors in input order and usage.
- :func:`split` and :func:`gather`: a batch cut into parts of at most N inputs, sent at most
  ``parallel`` at a time, results in order; the first failure cancels the rest and is raised
  (nothing is half-returned).
"""

from __future__ import annotations

import binascii
import functools
import struct
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar, cast

import orjson

from backends.base import TokenUsage
from backends.emulation.fanout import all_or_nothing
from backends.errors import UpstreamProtocolError

__all__ = ["base64_vectors", "check_vectors", "embedding_list", "gather", "split"]

_T = TypeVar("_T")
_R = TypeVar("_R")


@functools.lru_cache(maxsize=64)
def _packer(dims: int) -> struct.Struct:
    return struct.Struct(f"<{dims}f")


def base64_vectors(rows: Sequence[Sequence[float]], backend: str) -> list[bytes]:
    """Each row as base64 (ASCII bytes) of its little-endian float32 values (OpenAI's ``base64``).

    Per row: one ``struct`` pack of its Python floats (exact: a float32 value round-trips through
    a double), one ``binascii`` encode; the bytes go into the answer as they are
    (:func:`embedding_list`), never through ``str``. 256 x 1,024: ``bench/base64_vectors.py``.
    A row that is not all numbers is the upstream's broken answer (``UpstreamProtocolError``).
    """
    encode = binascii.b2a_base64
    width = len(rows[0]) if rows else 0
    pack = _packer(width).pack
    try:
        return [encode((pack if len(row) == width else _packer(len(row)).pack)(*row), newline=False) for row in rows]
    except struct.error:
        raise UpstreamProtocolError(
            "the upstream sent an embedding that is not a list of numbers", backend=backend
        ) from None


def check_vectors(rows: Any, count: int, backend: str) -> list[list[float]]:
    """``rows`` as ``count`` vectors of numbers, or an ``UpstreamProtocolError`` (a broken answer)."""
    if not isinstance(rows, list) or len(rows) != count:
        got = len(rows) if isinstance(rows, list) else type(rows).__name__
        raise UpstreamProtocolError(f"the upstream sent {got} embeddings for {count} inputs", backend=backend)
    for row in rows:
        # The first number stands for the row (a full walk costs ~10 ms on 256 x 1,024); a
        # string further on is caught when packed for base64, or reaches the client as sent.
        if not isinstance(row, list) or not row or type(row[0]) not in (float, int):
            raise UpstreamProtocolError("the upstream sent an embedding that is not a list of numbers", backend=backend)
    return rows


def embedding_list(
    vectors: Sequence[list[float]] | Sequence[str] | Sequence[bytes], model: str, usage: TokenUsage
) -> bytes:
    """OpenAI's answer: the ``list`` object, ``data[i].index`` in input order, ``usage``.

    Vectors are floats, base64 strings (as a server wrote them) or base64 bytes
    (:func:`base64_vectors`), which are written into the body as they are: base64 is JSON-safe ASCII.
    """
    tail = {"model": model, "usage": {"prompt_tokens": usage.prompt_tokens, "total_tokens": usage.prompt_tokens}}
    if vectors and type(vectors[0]) is bytes:
        encoded = cast("Sequence[bytes]", vectors)
        items = b",".join(b'{"object":"embedding","index":%d,"embedding":"%b"}' % (i, v) for i, v in enumerate(encoded))
        return b'{"object":"list","data":[' + items + b"]," + orjson.dumps(tail)[1:]
    data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
    return orjson.dumps({"object": "list", "data": data, **tail})


def split(items: Sequence[_T], size: int) -> list[Sequence[_T]]:
    """``items`` in consecutive parts of at most ``size`` (one part when it fits)."""
    if len(items) <= size:
        return [items]
    return [items[i : i + size] for i in range(0, len(items), size)]


async def gather(parts: Sequence[_T], send: Callable[[_T], Awaitable[_R]], parallel: int) -> list[_R]:
    """``send(part)`` for every part, at most ``parallel`` at once; results in part order.

    The first failure cancels the parts still running and is raised as it came (the upstream's
    error), so a request gets all of its batch or an error, never part of it.
    """
    return await all_or_nothing([functools.partial(send, part) for part in parts], parallel)
