"""The gateway's own base64 embeddings (``backends.emulation.vectors``): exact; a broken row is the upstream's error."""

from __future__ import annotations

import base64
import struct

import orjson
import pytest

from backends.base import TokenUsage
from backends.emulation.vectors import base64_vectors, embedding_list
from backends.errors import UpstreamProtocolError


def test_base64_decodes_to_the_float32_values_and_the_body_is_openais() -> None:
    rows = [[0.5, -1.25, 3.0e-8], [1.0, 2.0], [7.0, 8.0, 9.0]]  # a ragged batch too
    encoded = base64_vectors(rows, "b")
    assert [list(struct.unpack(f"<{len(r)}f", base64.b64decode(e))) for r, e in zip(rows, encoded, strict=True)] == [
        list(struct.unpack(f"<{len(r)}f", struct.pack(f"<{len(r)}f", *r))) for r in rows
    ]
    body = orjson.loads(embedding_list(encoded, "m", TokenUsage(3, 0)))
    assert body == {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": e.decode()} for i, e in enumerate(encoded)],
        "model": "m",
        "usage": {"prompt_tokens": 3, "total_tokens": 3},
    }
    assert embedding_list([[1.5]], "m", TokenUsage(1, 0)) == orjson.dumps(
        {
            "object": "list",
            "data": [{"object": "embedding", "index": 0, "embedding": [1.5]}],
            "model": "m",
            "usage": {"prompt_tokens": 1, "total_tokens": 1},
        }
    )


def test_a_row_that_is_not_numbers_is_the_upstreams_error() -> None:
    with pytest.raises(UpstreamProtocolError) as broken:
        base64_vectors([[1.0, 2.0], [1.0, "x"]], "up")  # type: ignore[list-item]
    assert broken.value.backend == "up"
