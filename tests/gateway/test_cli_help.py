"""``gateway --help`` lists what an operator runs and says what the gateway serves; the internal
``worker`` command stays runnable (``serve --workers N`` starts it) but unlisted."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from gateway.cli import main

ROOT = Path(__file__).resolve().parents[2]
SERVED = ("Completions", "Chat Completions", "Responses", "embeddings", "rerank")


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines


def test_help_lists_the_commands_without_the_internal_worker(capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(["--help"], capsys)
    for command in ("serve", "check-config", "config-schema", "pool"):
        assert command in text
    assert "worker" not in text and "SUPPRESS" not in text, text
    assert all(word in text for word in SERVED), text
    assert "--workers" in _help(["worker", "--help"], capsys)  # hidden, not gone


def test_the_package_says_what_the_gateway_serves() -> None:
    description = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["description"]
    assert all(word in description for word in SERVED), description
