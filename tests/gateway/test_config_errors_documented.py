"""docs/configuration.md's "When the file is wrong": each example file, run through ``gateway
check-config``, gives exactly the output printed under it: every mistake at once, each with its
line and column and the nearest valid key or name (or the message its ``${VAR:?...}`` gives)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway.cli import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
_BLOCK = re.compile(r"```yaml\n(?P<config>.*?)```\n.*?```text\n(?P<output>.*?)```", re.S)
_LINE = re.compile(r"^  (?P<file>[\w.-]+):(?P<line>\d+):(?P<column>\d+): (?P<path>\S+): (?P<message>.+)$")


def examples() -> list[tuple[str, str]]:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("\n## When the file is wrong\n", 1)[1].split("\n## ", 1)[0]
    found = [(m.group("config"), m.group("output")) for m in _BLOCK.finditer(section)]
    assert found, "no example in docs/configuration.md's 'When the file is wrong'"
    return found


@pytest.mark.parametrize("command", [["check-config"], ["serve", "--config"]], ids=["check-config", "serve"])
@pytest.mark.parametrize(("config", "output"), examples())
def test_documented_mistakes_are_all_reported_with_line_and_advice(
    config: str,
    output: str,
    command: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    header, *problems = output.splitlines()
    name = header.split(":", 1)[0]
    (tmp_path / name).write_text(config, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TEAM_A_KEY", "0123456789abcdefghij")  # as the text says: set ...
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # ... and not
    assert main([*command, name]) == 1  # serve refuses to start with the same report
    assert capsys.readouterr().err == output
    assert header == f"{name}: {len(problems)} problem(s)"
    lines = config.splitlines()
    for problem in problems:
        found = _LINE.match(problem)
        assert found, problem
        # Line and column point at the unknown key, or at the value the message names.
        at = lines[int(found["line"]) - 1][int(found["column"]) - 1 :]
        token = re.match(r'"?(?:\$\{)?([\w.-]+)', at)
        assert token and token.group(1) in problem, (problem, at)
        assert "did you mean" in found["message"] or "environment variable" in found["message"], problem
