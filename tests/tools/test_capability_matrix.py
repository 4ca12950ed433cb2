"""README's capability matrix is exactly what the capability tables render."""

from __future__ import annotations

from pathlib import Path

from schemas.config import BACKEND_TYPES
from tools.capability_matrix import BEGIN, END, columns, main, render, replace_block

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_shows_the_rendered_matrix() -> None:
    text = README.read_text(encoding="utf-8")
    start = text.index(BEGIN)
    end = text.index(END, start) + len(END) + 1
    assert text[start:end] == render(), "README is stale: run `python -m tools.capability_matrix --write README.md`"


def test_every_backend_type_has_a_column() -> None:
    kinds = {kind for kind, _, _ in columns()}
    assert kinds | {"vllm-pool"} == set(BACKEND_TYPES)  # vllm-pool workers are vLLM servers: vLLM's columns


def test_write_replaces_only_the_block(tmp_path: Path) -> None:
    target = tmp_path / "doc.md"
    target.write_text(f"before\n{BEGIN}\nold\n{END}\nafter\n", encoding="utf-8")
    assert main(["--write", str(target)]) == 0
    assert target.read_text(encoding="utf-8") == "before\n" + render() + "after\n"
    assert replace_block(target.read_text(encoding="utf-8"), render()) == target.read_text(encoding="utf-8")
