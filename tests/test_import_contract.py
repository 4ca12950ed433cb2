"""The import contract (STYLE principle 12) holds: ``lint-imports`` keeps every contract in pyproject.toml.

The contracts live in ``[tool.importlinter]`` so that ``.venv/bin/lint-imports`` shows the same
verdicts by hand. This test runs that command once and turns each contract into a test case, so a
broken contract fails CI with import-linter's own explanation (which import, which line).

Some contracts are broken by imports that the issue-12 refactoring is removing on other branches.
Those are listed in ``KNOWN_BREAKS`` with the imports as import-linter prints them: while a contract
is broken by exactly those imports (or a subset), its case is an expected failure; any other import
that breaks it fails at once, so the contract is enforced against new violations in the meantime.
Once a contract is kept, its entry is stale and the case warns until someone deletes it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONTRACTS: list[dict[str, str]] = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
    "importlinter"
]["contracts"]

# contract id -> (why it is broken today, the imports import-linter names as breaking it).
KNOWN_BREAKS: dict[str, tuple[str, frozenset[str]]] = {}


def _run_lint_imports() -> str:
    exe = Path(sys.executable).with_name("lint-imports")
    # Wide columns: rich would otherwise wrap long module names and break the parsing below.
    env = os.environ | {"COLUMNS": "250", "NO_COLOR": "1", "TERM": "dumb"}
    done = subprocess.run(
        [str(exe), "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode in (0, 1), f"lint-imports could not run:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def report() -> str:
    return _run_lint_imports()


def _verdict(report: str, name: str) -> str:
    found = re.search(rf"^{re.escape(name)} (KEPT|BROKEN)(?: \(\d+ ignored imports?\))?$", report, re.MULTILINE)
    assert found, f"lint-imports did not report contract {name!r}:\n{report}"
    return found.group(1)


def _section(report: str, name: str) -> str:
    """The 'Broken contracts' part of the report about contract ``name``."""
    underline = "-" * len(name)
    start = report.find(f"\n{name}\n{underline}\n")
    assert start >= 0, f"no explanation of broken contract {name!r} in:\n{report}"
    rest = report[start + len(name) + len(underline) + 3 :]
    following = re.search(r"\n\n(\S[^\n]*)\n-+\n", rest)  # the next contract's heading
    return rest[: following.start()] if following else rest


def _breaking_imports(section: str) -> set[str]:
    """The imports a broken contract's explanation names, as ``importer -> imported`` with absolute names.

    Forbidden contracts print ``-   gateway.metrics -> backends.vllm.pool (l.21)``; acyclic_siblings
    prints ``- .state -> .security (1 import)`` under ``No cycles are allowed in gateway.``.
    """
    imports: set[str] = set()
    parent = ""
    for line in section.splitlines():
        if heading := re.match(r"No cycles are allowed in (\S+)\.$", line.strip()):
            parent = heading.group(1)
        elif edge := re.match(r"-\s+(\S+) -> (\S+) \(", line.strip()):
            importer, imported = (parent + name if name.startswith(".") else name for name in edge.groups())
            imports.add(f"{importer} -> {imported}")
    return imports


@pytest.mark.parametrize("contract", CONTRACTS, ids=[c["id"] for c in CONTRACTS])
def test_contract_is_kept(report: str, contract: dict[str, str]) -> None:
    name = contract["name"]
    verdict = _verdict(report, name)
    known = KNOWN_BREAKS.get(contract["id"])
    if verdict == "KEPT":
        if known:
            warnings.warn(f"contract {contract['id']!r} is kept now: delete its KNOWN_BREAKS entry", stacklevel=1)
        return
    section = _section(report, name)
    if known is None:
        pytest.fail(f"import contract broken: {name}\n{section}")
    why, allowed = known
    breaking = _breaking_imports(section)
    assert breaking, f"could not read which imports break {name!r} (has the report format changed?):\n{section}"
    new = breaking - allowed
    assert not new, f"import contract {name!r} broken by new imports {sorted(new)}:\n{section}"
    pytest.xfail(f"expected to be enforced after the issue-12 merges: {why}")


def test_known_breaks_name_real_contracts() -> None:
    assert set(KNOWN_BREAKS) <= {c["id"] for c in CONTRACTS}


def test_the_parser_reads_both_report_shapes() -> None:
    """The parsing above follows import-linter's report format; this pins the two shapes it reads."""
    forbidden = "gateway is not allowed to import backends.vllm:\n\n-   gateway.metrics -> backends.vllm.pool (l.21)\n"
    acyclic = "No cycles are allowed in gateway.\nIt could be made acyclic by removing 1 dependency:\n\n" + (
        "- .state -> .security (1 import)\n"
    )
    assert _breaking_imports(forbidden) == {"gateway.metrics -> backends.vllm.pool"}
    assert _breaking_imports(acyclic) == {"gateway.state -> gateway.security"}
