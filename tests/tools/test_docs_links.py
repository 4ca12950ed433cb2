"""Every relative link in README.md and docs/*.md resolves: the file exists, and a ``#anchor``
matches a heading of the target by GitHub's slug rule. Every docs page is linked from README.

External links (``http:``, ``https:``, ``mailto:``) are not fetched: CI has no network to check them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
_EXTERNAL = ("http://", "https://", "mailto:")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """``(line number, line)`` outside fenced code blocks."""
    lines: list[tuple[int, str]] = []
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text, lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading anchors on its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in ``path``; a repeated slug gets ``-1``, ``-2``, ... as on GitHub."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, line in _prose_lines(path.read_text(encoding="utf-8")):
        if heading := _HEADING.match(line):
            slug = github_slug(heading.group(2))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def links(path: Path) -> list[tuple[int, str]]:
    """``(line number, target)`` of every markdown link outside code blocks and code spans."""
    found: list[tuple[int, str]] = []
    for number, line in _prose_lines(path.read_text(encoding="utf-8")):
        for match in _LINK.finditer(_CODE_SPAN.sub("", line)):
            found.append((number, match.group(1)))
    return found


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """What is wrong with ``path``'s relative links, one line each (paths relative to ``root``)."""
    problems: list[str] = []
    for number, target in links(path):
        if target.startswith(_EXTERNAL):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(root)}:{number}: {target}"
        if not dest.exists():
            problems.append(f"{where}: no such file")
        elif anchor:
            if dest.suffix != ".md":
                problems.append(f"{where}: an anchor into a file that is not markdown")
            elif anchor not in anchors(dest):
                problems.append(f"{where}: no heading with that anchor in {dest.relative_to(root)}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_every_docs_page_is_linked_from_readme() -> None:
    linked = {(ROOT / target.partition("#")[0]).resolve() for _, target in links(ROOT / "README.md")}
    orphans = [str(p.relative_to(ROOT)) for p in PAGES[1:] if p.resolve() not in linked]
    assert orphans == [], "docs pages no README link leads to"


def test_the_checker_finds_broken_links_and_anchors(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# The `mock` backend: ≥ 0.12\n\n## What CI checks\n## What CI checks\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n"
        "[ok](other.md#the-mock-backend--012) [ok](other.md#what-ci-checks-1) [ok](#title) "
        "[ext](https://example.com/x#y)\n"
        "[gone](missing.md) [bad anchor](other.md#nope) [bad local](#nowhere)\n"
        "`[in code](missing.md)`\n"
        "```\n[in a fence](missing.md)\n# not a heading\n```\n"
        "[fenced heading](#not-a-heading)\n"
    )
    assert broken_links(page, tmp_path) == [
        "page.md:3: missing.md: no such file",
        "page.md:3: other.md#nope: no heading with that anchor in other.md",
        "page.md:3: #nowhere: no heading with that anchor in page.md",
        "page.md:9: #not-a-heading: no heading with that anchor in page.md",
    ]


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        ("Native backends: `tgi`, `ollama`, `llamacpp`", "native-backends-tgi-ollama-llamacpp"),
        ("Compose (one box, with monitoring)", "compose-one-box-with-monitoring"),
        (
            "`schemas/`: the wire and the config, importing nothing of ours",
            "schemas-the-wire-and-the-config-importing-nothing-of-ours",
        ),
        ("The `mock` backend", "the-mock-backend"),
        ("See [deploy](deploy.md)", "see-deploy"),
    ],
)
def test_github_slug(heading: str, slug: str) -> None:
    assert github_slug(heading) == slug
