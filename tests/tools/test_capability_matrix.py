"""README's endpoint summary and docs/capabilities.md's matrices are exactly what the capability tables render."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.capabilities import Level
from backends.chat_capabilities import CHAT_FIELDS
from schemas.config import BACKEND_TYPES
from schemas.endpoints import Endpoint
from tools.capability_matrix import (
    BEGIN,
    CHAT_BEGIN,
    CHAT_DOC,
    CHAT_END,
    CHAT_LINK_BEGIN,
    CHAT_LINK_END,
    END,
    ENDPOINTS_BEGIN,
    ENDPOINTS_END,
    POOLING_BEGIN,
    POOLING_END,
    RESPONSES_BEGIN,
    RESPONSES_END,
    blocks,
    chat_columns,
    chat_keys,
    columns,
    endpoint_rows,
    main,
    pooling_columns,
    render,
    render_chat,
    render_chat_link,
    render_endpoints,
    render_pooling,
    render_responses,
    replace_block,
    responses_columns,
)

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
STALE = "stale: run `python -m tools.capability_matrix --write README.md --write docs/capabilities.md`"


def block_of(text: str, begin: str, end: str) -> str:
    start = text.index(begin)
    return text[start : text.index(end, start) + len(end) + 1]


def test_readme_shows_which_endpoints_each_backend_type_serves() -> None:
    text = README.read_text(encoding="utf-8")
    assert block_of(text, ENDPOINTS_BEGIN, ENDPOINTS_END) == render_endpoints(), "README is " + STALE
    assert BEGIN not in text, "the completions matrix lives in docs/capabilities.md"


def test_docs_show_the_rendered_completions_matrix() -> None:
    text = (ROOT / CHAT_DOC).read_text(encoding="utf-8")
    assert block_of(text, BEGIN, END) == render(), CHAT_DOC + " is " + STALE


def test_readme_links_the_matrices_right_after_the_endpoint_summary() -> None:
    text = README.read_text(encoding="utf-8")
    assert block_of(text, CHAT_LINK_BEGIN, CHAT_LINK_END) == render_chat_link(), "README is " + STALE
    assert text.index(CHAT_LINK_BEGIN) == text.index(ENDPOINTS_END) + len(ENDPOINTS_END) + 2  # one blank line
    assert len(text.splitlines()) <= 260, "README is a five-minute read: long tables belong in docs/"


def test_the_endpoint_summary_is_every_backend_type_and_what_its_adapter_serves() -> None:
    rows = dict(endpoint_rows())
    assert set(rows) == set(BACKEND_TYPES)
    for kind, cls in _classes().items():
        assert rows[kind] == cls.endpoints
    table = render_endpoints()
    assert "| `tei` | — | — | — | yes | yes | — |" in table
    assert "| `tgi` | yes | yes | yes | — | — | — |" in table


def test_docs_show_the_rendered_chat_matrix() -> None:
    text = (ROOT / CHAT_DOC).read_text(encoding="utf-8")
    assert block_of(text, CHAT_BEGIN, CHAT_END) == render_chat(), CHAT_DOC + " is " + STALE


def test_every_backend_type_has_a_column() -> None:
    # tei serves no generation; pool workers are vLLM and share its columns.
    assert {kind for kind, _, _ in columns()} | {"vllm-pool", "tei"} == set(BACKEND_TYPES)
    assert {kind for kind, _, _ in chat_columns()} | {"vllm-pool", "tei"} == set(BACKEND_TYPES)
    embedders = {name for name, cls in _classes().items() if Endpoint.EMBEDDINGS in cls.endpoints}
    rerankers = {name for name, cls in _classes().items() if Endpoint.RERANK in cls.endpoints}
    assert {kind for kind, _, _ in pooling_columns("embeddings")} == embedders  # vllm-pool: vLLM's columns
    assert {kind for kind, _, _ in pooling_columns("rerank")} == rerankers


def _classes() -> dict[str, type]:
    from backends.mock import MockBackend
    from backends.native.llamacpp import LlamaCppBackend
    from backends.native.ollama import OllamaBackend
    from backends.native.tei import TEIBackend
    from backends.native.tgi import TGIBackend
    from backends.openai.adapter import OpenAIBackend
    from backends.vllm.adapter import VLLMBackend

    kinds = (OpenAIBackend, VLLMBackend, MockBackend, TGIBackend, OllamaBackend, LlamaCppBackend, TEIBackend)
    return {cls.kind: cls for cls in kinds}


def test_docs_show_the_rendered_pooling_matrix() -> None:
    text = (ROOT / CHAT_DOC).read_text(encoding="utf-8")
    assert block_of(text, POOLING_BEGIN, POOLING_END) == render_pooling(), CHAT_DOC + " is " + STALE


def test_chat_rows_are_every_field_then_every_form_of_every_table() -> None:
    tables = [table for _, _, table in chat_columns()]
    keys = chat_keys(tables)
    assert keys[: len(CHAT_FIELDS)] == list(CHAT_FIELDS)
    assert {key for table in tables for key, _ in table.rows()} == set(keys)
    forms = keys[len(CHAT_FIELDS) :]
    assert forms == sorted(forms) and all("=" in key for key in forms)


@pytest.mark.parametrize(
    "key", ["tgi_top_logprobs", "ollama_tool_choice_required", "vllm_unknown_auto", "native_strict_tools"]
)
def test_chat_cells_say_what_the_tables_enforce(key: str) -> None:
    rows = {line.split(" | ")[0].strip("| `"): line for line in render_chat().splitlines() if line.startswith("| `")}
    titles = [title for _, title, _ in chat_columns()]
    cells = {name: [c.strip() for c in line.strip("|").split("|")[1:]] for name, line in rows.items()}
    if key == "tgi_top_logprobs":
        assert cells["top_logprobs"][titles.index("`tgi`")] == "native ≤ 5"
    elif key == "ollama_tool_choice_required":
        assert cells["tool_choice=required"][titles.index("`ollama`")] == Level.UNSUPPORTED.value
    elif key == "native_strict_tools":  # honoured with a footnote saying how, or refused
        strict = cells["tools=strict"]
        assert strict[titles.index("`tgi`")] == strict[titles.index("`llamacpp`")] == Level.NATIVE.value + "†"
        assert strict[titles.index("`ollama`")] == Level.UNSUPPORTED.value
        chat = render_chat()
        assert "- † `tools=strict` on `tgi`: TGI's tool grammar" in chat
        assert "- † `tools=strict` on `llamacpp`: llama.cpp (--jinja)" in chat
    else:  # no tool parser: "auto" refused; with one (newest column) the field's level
        assert cells["tool_choice=auto"][1] == Level.UNSUPPORTED.value
        assert cells["tool_choice=auto"][2] == Level.NATIVE.value


def test_write_replaces_only_the_block(tmp_path: Path) -> None:
    target = tmp_path / "doc.md"
    target.write_text(f"before\n{BEGIN}\nold\n{END}\nafter\n", encoding="utf-8")
    assert main(["--write", str(target)]) == 0
    assert target.read_text(encoding="utf-8") == "before\n" + render() + "after\n"
    assert replace_block(target.read_text(encoding="utf-8"), render()) == target.read_text(encoding="utf-8")


def test_write_renders_every_block_each_file_holds(tmp_path: Path) -> None:
    readme, doc = tmp_path / "README.md", tmp_path / "capabilities.md"
    readme.write_text(
        f"a\n{ENDPOINTS_BEGIN}\nx\n{ENDPOINTS_END}\n\n{CHAT_LINK_BEGIN}\ny\n{CHAT_LINK_END}\nb\n", encoding="utf-8"
    )
    doc.write_text(
        f"# t\n{CHAT_BEGIN}\nz\n{CHAT_END}\n\n{POOLING_BEGIN}\nw\n{POOLING_END}\n\n{BEGIN}\nv\n{END}\n",
        encoding="utf-8",
    )
    assert main(["--write", str(readme), "--write", str(doc)]) == 0
    assert readme.read_text(encoding="utf-8") == f"a\n{render_endpoints()}\n{render_chat_link()}b\n"
    assert doc.read_text(encoding="utf-8") == "# t\n" + render_chat() + "\n" + render_pooling() + "\n" + render()
    assert len(blocks()) == 6


def test_docs_show_the_rendered_responses_matrix() -> None:
    text = (ROOT / CHAT_DOC).read_text(encoding="utf-8")
    assert block_of(text, RESPONSES_BEGIN, RESPONSES_END) == render_responses(), CHAT_DOC + " is " + STALE


def test_every_backend_type_with_chat_has_a_responses_column() -> None:
    """Responses goes through chat (or OpenAI's own endpoint): the types that serve chat serve it too."""
    assert [kind for kind, _, _ in responses_columns()] == [kind for kind, _, _ in chat_columns()]


def test_bridged_responses_columns_follow_their_chat_columns() -> None:
    """A bridged family's Responses levels are its chat levels: change chat, and Responses follows."""
    chat = {title: table for _, title, table in chat_columns()}
    for kind, title, table in responses_columns():
        if kind == "openai":
            continue
        chat_table = chat[title]
        assert table.level("temperature") == chat_table.level("temperature")
        assert table.level("tool_choice", "required") == chat_table.level("tool_choice", "required")
        assert table.level("reasoning", "effort") == chat_table.level("reasoning_effort")
        assert table.level("text", "json_schema") == chat_table.level("response_format", "json_schema")
        assert table.level("tools", "web_search") is Level.UNSUPPORTED
