"""``deploy/gpu-check.sh`` end to end, with stand-in workers instead of vLLM and no GPU.

On a GPU machine the script runs real ``vllm serve`` workers; here the same path (config,
``gateway serve``, readiness through ``gateway pool status``, the load, the report, the
shutdown and its leftover check) runs against the stand-in, so the script cannot rot.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.backends.vllm.pool.conftest import STANDIN
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[4]


@pytest.mark.slow
def test_gpu_check_script_dry_run(tag: str) -> None:
    env = {
        **os.environ,
        "GPU_CHECK_NO_GPU": "1",
        "VLLM_CMD": f"{sys.executable} {STANDIN}",
        "VLLM_ARGS": f"--standin-sim --standin-token-ms 2 --standin-tag {tag}",
        "WORKERS": "2",
        "REQUESTS": "40",
        "MAX_TOKENS": "4",
        "PORT": str(free_port()),
        "STARTUP_TIMEOUT": "60",
        "POLL": "0.2",
        "PYTHON": sys.executable,
    }
    done = subprocess.run(
        ["bash", "deploy/gpu-check.sh", "standin-model", "[]"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "2 worker(s) ready" in out
    assert "40 requests (0 errors)" in out and "req/s; TTFT p50" in out and "score decided by" in out
    assert "worker  state" in out and "prefix: approximate" in out  # the stand-in serves no tokenizer
    assert out.rstrip().endswith("gpu-check: OK (gateway stopped, no worker process left)")
