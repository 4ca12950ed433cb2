"""The capability matrix of every backend type, rendered from the capability tables as markdown.

Each family's tables live in its own folder (``backends/<family>/capabilities.py``,
``backends/native/<server>_capabilities.py``); this tool only lays them out side by side.

``python -m tools.capability_matrix`` prints it; ``--write README.md --write docs/capabilities.md``
replaces, in each file, every block whose markers it holds: the completions matrix
(``<!-- capability-matrix -->``), the chat matrix (``<!-- chat-capability-matrix -->``, rows from
:meth:`ChatCapabilities.rows`: fields, then value forms such as ``tool_choice=required``) and
README's pointer to them (``<!-- chat-capability-link -->``; the tables are too long for a
five-minute README, which shows which endpoints each backend type serves: ``<!-- endpoint-matrix -->``,
from the adapters' ``endpoints``), and the Responses matrix (``<!-- responses-capability-matrix -->``, rows from
:meth:`ResponsesCapabilities.rows`: fields, then forms such as ``tools=web_search``; the bridged
families' rows are derived from their chat tables). ``tests/tools/test_capability_matrix.py`` checks
that the files hold exactly what this renders, so the docs cannot drift from the tables the router enforces.

A cell ``native ≤ 20`` means the backend honours the field up to that value (its own
bound, e.g. vLLM's ``--max-logprobs`` default) and refuses more by name.

vLLM's tables depend on the server's version (``backends.vllm.capabilities``): two columns show
an unknown version (the table that cannot fail open) and the newest version boundary.
``vllm-pool`` workers are vLLM servers and share those tables.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from backends.capabilities import ALL_FIELDS, Capabilities
from backends.chat_capabilities import CHAT_FIELDS, ChatCapabilities
from backends.mock.capabilities import MOCK_CAPABILITIES, MOCK_CHAT, MOCK_EMBEDDINGS, MOCK_RERANK, MOCK_RESPONSES
from backends.native.llamacpp_capabilities import (
    LLAMACPP_CAPABILITIES,
    LLAMACPP_CHAT,
    LLAMACPP_EMBEDDINGS,
    LLAMACPP_RESPONSES,
)
from backends.native.ollama_capabilities import OLLAMA_CAPABILITIES, OLLAMA_CHAT, OLLAMA_EMBEDDINGS, OLLAMA_RESPONSES
from backends.native.tei_capabilities import TEI_EMBEDDINGS, TEI_RERANK
from backends.native.tgi_capabilities import TGI_CAPABILITIES, TGI_CHAT, TGI_RESPONSES
from backends.openai.capabilities import (
    OPENAI_CAPABILITIES,
    OPENAI_CHAT,
    OPENAI_EMBEDDINGS,
    OPENAI_RERANK,
    OPENAI_RESPONSES,
)
from backends.pooling_capabilities import PoolingCapabilities
from backends.responses.capabilities import GATEWAY_FIELDS, RESPONSES_FIELDS, ResponsesCapabilities
from backends.vllm.capabilities import (
    POOLING_BOUNDARIES,
    capabilities_for,
    vllm_chat_capabilities,
    vllm_pooling_tables,
    vllm_responses_capabilities,
)
from backends.vllm.versions import BOUNDARIES, CHAT_BOUNDARIES, VLLMChatFeatures, VLLMFeatures
from schemas.endpoints import Endpoint

__all__ = [
    "BEGIN",
    "CHAT_BEGIN",
    "CHAT_DOC",
    "CHAT_END",
    "CHAT_LINK_BEGIN",
    "CHAT_LINK_END",
    "END",
    "ENDPOINTS_BEGIN",
    "ENDPOINTS_END",
    "RESPONSES_BEGIN",
    "RESPONSES_END",
    "blocks",
    "chat_columns",
    "chat_keys",
    "columns",
    "endpoint_rows",
    "render",
    "render_chat",
    "render_chat_link",
    "render_endpoints",
    "render_responses",
    "replace_block",
    "responses_columns",
]

BEGIN = "<!-- capability-matrix: rendered by `python -m tools.capability_matrix`; do not edit by hand -->"
END = "<!-- /capability-matrix -->"
CHAT_BEGIN = "<!-- chat-capability-matrix: rendered by `python -m tools.capability_matrix`; do not edit by hand -->"
CHAT_END = "<!-- /chat-capability-matrix -->"
CHAT_LINK_BEGIN = "<!-- chat-capability-link: rendered by `python -m tools.capability_matrix` -->"
CHAT_LINK_END = "<!-- /chat-capability-link -->"
CHAT_DOC = "docs/capabilities.md"
RESPONSES_BEGIN = (
    "<!-- responses-capability-matrix: rendered by `python -m tools.capability_matrix`; do not edit by hand -->"
)
RESPONSES_END = "<!-- /responses-capability-matrix -->"


def columns() -> list[tuple[str, str, Capabilities]]:
    """``(backend type, column title, table)`` in the order the matrix shows them."""
    newest = max(BOUNDARIES.values())
    return [
        ("openai", "`openai`", OPENAI_CAPABILITIES),
        ("vllm", "`vllm` (version unknown)", capabilities_for(VLLMFeatures.of(None))),
        ("vllm", f"`vllm` ≥ {newest.major}.{newest.minor}", capabilities_for(VLLMFeatures.of(newest))),
        ("mock", "`mock`", MOCK_CAPABILITIES),
        ("tgi", "`tgi`", TGI_CAPABILITIES),
        ("ollama", "`ollama`", OLLAMA_CAPABILITIES),
        ("llamacpp", "`llamacpp`", LLAMACPP_CAPABILITIES),
    ]


def render() -> str:
    cols = columns()
    lines = [BEGIN, "", "| field | " + " | ".join(title for _, title, _ in cols) + " |"]
    lines.append("|---" * (len(cols) + 1) + "|")
    notes: dict[tuple[str, str], list[str]] = {}  # (field, why) -> backend types
    how: dict[tuple[str, str], list[str]] = {}  # (field, how the gateway honours it) -> backend types
    for name in ALL_FIELDS:
        cells = []
        for kind, _, table in cols:
            cell = table.level(name).value
            limit = table.limits.get(name)
            if limit is not None:
                cell += f" ≤ {limit}"
            for rule in table.rules:
                if rule.field == name:
                    cell = cell + "*" if not cell.endswith("*") else cell
                    if kind not in notes.setdefault((name, rule.why), []):
                        notes[(name, rule.why)].append(kind)
            cells.append(cell + _noted(name, kind, table.notes.get(name), how))
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    # One list for both kinds of footnote, right under its heading: README is held to its length.
    lines += ["", "\\* refused (400 `unsupported_parameter`) for some values" + _HOW_HEADING * bool(how) + ":"]
    for (name, why), kinds in notes.items():
        lines.append(f"- `{name}` on {', '.join(f'`{k}`' for k in kinds)}: {why}.")
    lines += [*_how_lines(how), "", END]
    return "\n".join(lines) + "\n"


def _noted(field: str, kind: str, note: str | None, how: dict[tuple[str, str], list[str]]) -> str:
    """``†`` for a cell whose table notes how the field is honoured; the note is kept for the footnote."""
    if note is None:
        return ""
    kinds = how.setdefault((field, note), [])
    if kind not in kinds:
        kinds.append(kind)
    return "†"


def _how_lines(how: dict[tuple[str, str], list[str]]) -> list[str]:
    return [f"- † `{f}` on {', '.join(f'`{k}`' for k in kinds)}: {note}." for (f, note), kinds in how.items()]


_HOW_HEADING = "; † how the gateway honours a field"


def _vllm_chat_columns() -> list[tuple[str, VLLMChatFeatures]]:
    """vLLM's chat and Responses columns: an unknown version without a tool parser (the table that
    cannot fail open) and the newest version boundary with one (``tool_parser:``)."""
    newest = max(*BOUNDARIES.values(), *CHAT_BOUNDARIES.values())
    return [
        ("`vllm` (version unknown, no `tool_parser`)", VLLMChatFeatures.of(None)),
        (f"`vllm` ≥ {newest.major}.{newest.minor} with `tool_parser`", VLLMChatFeatures.of(newest, "hermes")),
    ]


def chat_columns() -> list[tuple[str, str, ChatCapabilities]]:
    """``(backend type, column title, chat table)``: the tables the chat translators refuse by
    (vLLM's per version and tool parser: :func:`_vllm_chat_columns`)."""
    return [
        ("openai", "`openai`", OPENAI_CHAT),
        *(("vllm", title, vllm_chat_capabilities(features)) for title, features in _vllm_chat_columns()),
        ("mock", "`mock`", MOCK_CHAT),
        ("tgi", "`tgi`", TGI_CHAT),
        ("ollama", "`ollama`", OLLAMA_CHAT),
        ("llamacpp", "`llamacpp`", LLAMACPP_CHAT),
    ]


def chat_keys(tables: Sequence[ChatCapabilities]) -> list[str]:
    """Every row of the chat matrix: the fields in schema order, then every form any table names."""
    forms = {key for table in tables for key, _ in table.rows() if key not in CHAT_FIELDS}
    return [*CHAT_FIELDS, *sorted(forms)]


def render_chat() -> str:
    cols = chat_columns()
    lines = [CHAT_BEGIN, "", "| field or form | " + " | ".join(title for _, title, _ in cols) + " |"]
    lines.append("|---" * (len(cols) + 1) + "|")
    notes: dict[str, list[str]] = {}  # note -> backend types
    how: dict[tuple[str, str], list[str]] = {}  # (field, how the gateway honours it) -> backend types
    for key in chat_keys([table for _, _, table in cols]):
        field, _, form = key.partition("=")
        cells = []
        for kind, _, table in cols:
            cell = table.level(field, form or None).value
            if not form and (limit := table.limits.get(field)) is not None:
                cell += f" ≤ {limit}"
            for rule in table.exclusive:
                if not form and field == rule.fields[-1]:
                    cell += "*"
                    note = f"`{'` with `'.join(rule.fields)}`: {rule.why}"
                    if kind not in notes.setdefault(note, []):
                        notes[note].append(kind)
            for value_rule in table.rules:  # a version's bound on a value (vLLM 0.32's cache_salt)
                if not form and field == value_rule.field:
                    cell = cell if cell.endswith("*") else cell + "*"
                    note = f"`{field}`: {value_rule.why}"
                    if kind not in notes.setdefault(note, []):
                        notes[note].append(kind)
            cells.append(cell + _noted(key, kind, table.note(field, form or None), how))
        lines.append(f"| `{key}` | " + " | ".join(cells) + " |")
    heading = "\\* refused (400 `unsupported_parameter`) together with another field, or for some values"
    lines += ["", heading + _HOW_HEADING * bool(how) + ":"]
    lines += [f"- {note} ({', '.join(f'`{k}`' for k in kinds)})." for note, kinds in notes.items()]
    lines += [*_how_lines(how), "", CHAT_END]
    return "\n".join(lines) + "\n"


def render_chat_link() -> str:
    return (
        f"{CHAT_LINK_BEGIN}\n\nEvery field of every endpoint, per backend type (and per vLLM version), in "
        f"[docs/capabilities.md]({CHAT_DOC}): [chat]({CHAT_DOC}#chat-capability-matrix), "
        f"[Responses]({CHAT_DOC}#responses-capability-matrix), "
        f"[embeddings and rerank]({CHAT_DOC}#embeddings-and-rerank-capability-matrix), "
        f"[completions]({CHAT_DOC}#completions-capability-matrix).\n\n{CHAT_LINK_END}\n"
    )


ENDPOINTS_BEGIN = "<!-- endpoint-matrix: rendered by `python -m tools.capability_matrix`; do not edit by hand -->"
ENDPOINTS_END = "<!-- /endpoint-matrix -->"
_ENDPOINT_COLUMNS = (
    ("chat", (Endpoint.CHAT,)),
    ("Responses", (Endpoint.RESPONSES,)),
    ("completions", (Endpoint.COMPLETIONS,)),
    ("embeddings", (Endpoint.EMBEDDINGS,)),
    ("rerank", (Endpoint.RERANK,)),
    ("tokenize, detokenize", (Endpoint.TOKENIZE, Endpoint.DETOKENIZE)),
)


def endpoint_rows() -> list[tuple[str, frozenset[Endpoint]]]:
    """``(backend type, the endpoints its adapter serves)`` for every backend type, in config order."""
    from backends.mock import MockBackend
    from backends.native.llamacpp import LlamaCppBackend
    from backends.native.ollama import OllamaBackend
    from backends.native.tei import TEIBackend
    from backends.native.tgi import TGIBackend
    from backends.openai.adapter import OpenAIBackend
    from backends.vllm.adapter import VLLMBackend
    from backends.vllm.pool import VLLMPoolBackend

    kinds = (OpenAIBackend, VLLMBackend, VLLMPoolBackend, TGIBackend, OllamaBackend, LlamaCppBackend, TEIBackend)
    return [(cls.kind, frozenset(cls.endpoints)) for cls in (*kinds, MockBackend)]


def render_endpoints() -> str:
    """README's summary: which endpoints each backend type serves (the adapters' ``endpoints``)."""
    lines = [ENDPOINTS_BEGIN, "", "| backend type | " + " | ".join(t for t, _ in _ENDPOINT_COLUMNS) + " |"]
    lines.append("|---" * (len(_ENDPOINT_COLUMNS) + 1) + "|")
    for kind, served in endpoint_rows():
        cells = ["yes" if served.issuperset(eps) else "—" for _, eps in _ENDPOINT_COLUMNS]
        lines.append(f"| `{kind}` | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Responses is relayed to an `openai` backend and served over the backend's chat elsewhere (the gateway "
        "keeps the conversation); a `vllm-pool` of a pooling model (`--runner pooling`) serves embeddings, "
        "rerank and the tokenizer.",
        "",
        ENDPOINTS_END,
    ]
    return "\n".join(lines) + "\n"


POOLING_BEGIN = (
    "<!-- pooling-capability-matrix: rendered by `python -m tools.capability_matrix`; do not edit by hand -->"
)
POOLING_END = "<!-- /pooling-capability-matrix -->"


def pooling_columns(endpoint: str) -> list[tuple[str, str, PoolingCapabilities]]:
    """``(backend type, column title, table)`` of ``embeddings`` or ``rerank``: the types that serve it.

    vLLM's tables depend on the version: an unknown version and the newest pooling boundary.
    """
    newest = max(POOLING_BOUNDARIES.values())
    unknown, latest = vllm_pooling_tables(None), vllm_pooling_tables(newest)
    pick = 0 if endpoint == "embeddings" else 1
    vllm = [
        ("vllm", "`vllm` (version unknown)", unknown[pick]),
        ("vllm", f"`vllm` ≥ {newest.major}.{newest.minor}", latest[pick]),
    ]
    if endpoint == "embeddings":
        return [("openai", "`openai`", OPENAI_EMBEDDINGS), *vllm, ("mock", "`mock`", MOCK_EMBEDDINGS),
                ("ollama", "`ollama`", OLLAMA_EMBEDDINGS), ("llamacpp", "`llamacpp`", LLAMACPP_EMBEDDINGS),
                ("tei", "`tei`", TEI_EMBEDDINGS)]  # fmt: skip
    return [("openai", "`openai`", OPENAI_RERANK), *vllm, ("mock", "`mock`", MOCK_RERANK), ("tei", "`tei`", TEI_RERANK)]


def _render_pooling_table(endpoint: str, path: str) -> list[str]:
    cols = pooling_columns(endpoint)
    keys: list[str] = []
    for _, _, table in cols:
        keys += [key for key, _ in table.rows() if key not in keys]
    lines = [f"### {endpoint.capitalize()} (`{path}`)", ""]
    lines += ["| field or form | " + " | ".join(title for _, title, _ in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    why: dict[str, list[str]] = {}
    for key in keys:
        field, _, form = key.partition("=")
        cells = []
        for kind, _, table in cols:
            cell = table.level(field, form or None).value
            if any(rule.field == key for rule in table.rules):
                cell += "*"
                for rule in table.rules:
                    if rule.field == key and kind not in why.setdefault(f"`{key}`: {rule.why}", []):
                        why[f"`{key}`: {rule.why}"].append(kind)
            note = table.note(field, form or None)
            if note is not None:
                cell += "†"
                if kind not in why.setdefault(f"† `{key}`: {note}", []):
                    why[f"† `{key}`: {note}"].append(kind)
            cells.append(cell)
        lines.append(f"| `{key}` | " + " | ".join(cells) + " |")
    if why:
        lines += ["", "\\* refused (400 `unsupported_parameter`) for some values; † how the gateway honours it:"]
        lines += [f"- {text} ({', '.join(f'`{k}`' for k in kinds)})." for text, kinds in why.items()]
    return lines


def render_pooling() -> str:
    lines = [POOLING_BEGIN, ""]
    lines += _render_pooling_table("embeddings", "/v1/embeddings")
    lines += [""]
    lines += _render_pooling_table("rerank", "/v1/rerank")
    lines += ["", POOLING_END]
    return "\n".join(lines) + "\n"


def responses_columns() -> list[tuple[str, str, ResponsesCapabilities]]:
    """``(backend type, column title, Responses table)``: OpenAI's own endpoint, and every other
    family through its chat translator (so the same vLLM columns as chat)."""
    return [
        ("openai", "`openai`", OPENAI_RESPONSES),
        *(("vllm", title, vllm_responses_capabilities(features)) for title, features in _vllm_chat_columns()),
        ("mock", "`mock`", MOCK_RESPONSES),
        ("tgi", "`tgi`", TGI_RESPONSES),
        ("ollama", "`ollama`", OLLAMA_RESPONSES),
        ("llamacpp", "`llamacpp`", LLAMACPP_RESPONSES),
    ]


def render_responses() -> str:
    cols = responses_columns()
    lines = [RESPONSES_BEGIN, "", "| field or form | " + " | ".join(title for _, title, _ in cols) + " |"]
    lines.append("|---" * (len(cols) + 1) + "|")
    forms = sorted({key for _, _, table in cols for key, _ in table.rows() if key not in RESPONSES_FIELDS})
    for key in [*RESPONSES_FIELDS, *forms]:
        field, _, form = key.partition("=")
        cells = [table.level(field, form or None).value for _, _, table in cols]
        mark = "‡" if key in GATEWAY_FIELDS else ""
        lines.append(f"| `{key}`{mark} | " + " | ".join(cells) + " |")
    lines += ["", "‡ the gateway's own, on every backend:"]
    lines += [f"- `{name}`: {how}." for name, how in GATEWAY_FIELDS.items()]
    lines += ["", RESPONSES_END]
    return "\n".join(lines) + "\n"


def blocks() -> list[tuple[str, str, str]]:
    """``(begin marker, end marker, rendered block)`` of every block this tool keeps."""
    return [(BEGIN, END, render()), (CHAT_LINK_BEGIN, CHAT_LINK_END, render_chat_link()),
            (ENDPOINTS_BEGIN, ENDPOINTS_END, render_endpoints()),
            (CHAT_BEGIN, CHAT_END, render_chat()), (POOLING_BEGIN, POOLING_END, render_pooling()),
            (RESPONSES_BEGIN, RESPONSES_END, render_responses())]  # fmt: skip


def replace_block(text: str, block: str, begin: str = BEGIN, end: str = END) -> str:
    """``text`` with its block between ``begin`` and ``end`` (markers included) replaced by ``block``."""
    start = text.index(begin)
    stop = text.index(end, start) + len(end) + 1
    return text[:start] + block + text[stop:]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--write",
        metavar="FILE",
        action="append",
        help="replace the blocks FILE holds (README.md, docs/capabilities.md)",
    )
    parser.add_argument("--chat", action="store_true", help="print the chat matrix instead of the completions one")
    args = parser.parse_args(argv)
    for name in args.write or ():
        path = Path(name)
        text = path.read_text(encoding="utf-8")
        for begin, end, block in blocks():
            if begin in text:
                text = replace_block(text, block, begin, end)
        path.write_text(text, encoding="utf-8")
    if not args.write:
        sys.stdout.write(render_chat() if args.chat else render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
