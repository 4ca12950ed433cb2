"""The capability matrix of every backend type, rendered from the capability tables as markdown.

``python -m tools.capability_matrix`` prints it; ``--write README.md`` replaces the block
between ``<!-- capability-matrix -->`` markers in place. ``tests/backends/native`` checks that the
README's block is exactly what this renders, so the README cannot drift from the tables
the router enforces.

A cell ``native ≤ 20`` means the backend honours the field up to that value (its own
bound, e.g. vLLM's ``--max-logprobs`` default) and refuses more by name.

vLLM's table depends on the server's version (``backends.vllm.versions``): two columns show
an unknown version (the table that cannot fail open) and the newest version boundary.
``vllm-pool`` workers are vLLM servers and share those tables.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from backends.capabilities import ALL_FIELDS, Capabilities
from backends.mock import MOCK_CAPABILITIES
from backends.native.llamacpp import LLAMACPP_CAPABILITIES
from backends.native.ollama import OLLAMA_CAPABILITIES
from backends.native.tgi import TGI_CAPABILITIES
from backends.openai.adapter import OPENAI_CAPABILITIES
from backends.vllm.versions import BOUNDARIES, VLLMFeatures, capabilities_for

__all__ = ["BEGIN", "END", "columns", "render", "replace_block"]

BEGIN = "<!-- capability-matrix: rendered by `python -m tools.capability_matrix`; do not edit by hand -->"
END = "<!-- /capability-matrix -->"


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
            cells.append(cell)
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    lines += ["", "\\* refused (400 `unsupported_parameter`) for some values:", ""]
    for (name, why), kinds in notes.items():
        lines.append(f"- `{name}` on {', '.join(f'`{k}`' for k in kinds)}: {why}.")
    lines += ["", END]
    return "\n".join(lines) + "\n"


def replace_block(text: str, block: str) -> str:
    """``text`` with its matrix block (markers included) replaced by ``block``."""
    start = text.index(BEGIN)
    end = text.index(END, start) + len(END) + 1
    return text[:start] + block + text[end:]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--write", metavar="FILE", help="replace the matrix block in FILE (e.g. README.md)")
    args = parser.parse_args(argv)
    block = render()
    if args.write:
        path = Path(args.write)
        path.write_text(replace_block(path.read_text(encoding="utf-8"), block), encoding="utf-8")
    else:
        sys.stdout.write(block)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
