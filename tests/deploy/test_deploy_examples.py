"""Every example config under deploy/examples/ passes ``gateway check-config``, the real CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).parents[2] / "deploy" / "examples").glob("*.yaml"))


def test_there_are_examples() -> None:
    assert {p.name for p in EXAMPLES} >= {"quickstart.yaml", "vllm-pool.yaml"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_passes_check_config(path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "check-config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "OK" in done.stdout
