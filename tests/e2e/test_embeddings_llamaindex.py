"""LlamaIndex's ``OpenAIEmbedding`` pointed at the gateway, on every backend type that embeds.

LlamaIndex runs in its own cached virtualenv (``tests/e2e/setup_llamaindex.sh``; ``.ci/run``
installs it): one subprocess asks every model for a batch and a query embedding (the openai SDK's
default base64, decoded by it), and the vectors must be the upstream's for those texts.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.e2e.pooling_gateway import EMBEDDERS, PoolingGateway
from tests.pooling_upstream import fake_vector

VENV = Path(os.environ.get("GATEWAY_LLAMAINDEX_VENV") or Path.home() / ".cache" / "gateway-llamaindex-venv")
PYTHON = VENV / "bin" / "python"
SCRIPT = """
import json, sys
from llama_index.embeddings.openai import OpenAIEmbedding
url, out = sys.argv[1], {}
for model in sys.argv[2:]:
    embed = OpenAIEmbedding(model_name=model, api_base=url, api_key="x", max_retries=0, timeout=20)
    out[model] = {"batch": embed.get_text_embedding_batch(["hello world", "second text here"]),
                  "query": embed.get_query_embedding("a query")}
print(json.dumps(out))
"""


def expected(kind: str, text: str) -> list[float]:
    if kind == "mock":
        from backends.mock.pooling import mock_vector

        return mock_vector(text)
    return fake_vector(text)


async def test_llamaindex_openai_embedding_on_every_backend(pooling: PoolingGateway) -> None:
    if not PYTHON.exists():
        if os.environ.get("CI"):
            pytest.fail(f"no LlamaIndex environment at {VENV} (.ci/run installs it)")
        pytest.skip(f"no LlamaIndex environment at {VENV} (run `bash tests/e2e/setup_llamaindex.sh`)")
    models = [f"emb-{kind}" for kind in EMBEDDERS]
    proc = await asyncio.create_subprocess_exec(
        str(PYTHON), "-c", SCRIPT, f"{pooling.url}/v1", *models,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()[-3000:]
    answers: dict[str, Any] = orjson.loads(out)
    for kind in EMBEDDERS:
        got = answers[f"emb-{kind}"]
        assert got["batch"] == [expected(kind, "hello world"), expected(kind, "second text here")], kind
        assert got["query"] == expected(kind, "a query"), kind
