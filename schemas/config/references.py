"""Names that point across the config's sections, checked all at once, with the nearest valid name.

:func:`reference_problems` works on plain names, so the same check runs on the validated
models (``GatewayConfig``'s validator) and on the raw YAML when another part of the file
failed validation and the models were never built: a typo in a route's backend is reported
together with an unknown key elsewhere, not on the next run.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["ConfigProblems", "did_you_mean", "raw_reference_problems", "reference_problems"]

Problem = tuple[str, str]


class ConfigProblems(ValueError):
    """Several problems found by one model-level rule, each ``(yaml_path, message)``.

    Raised inside a validator, pydantic keeps it as the ``error`` of a ``value_error``; the
    config reader unpacks it so every problem keeps its own path.
    """

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(f"{path}: {message}" for path, message in self.problems))


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``choices``, else ``""``.

    Close: difflib's ratio of at least 0.7, or the same letters with two neighbours swapped or
    another case (``smi`` for ``sim``, which the ratio alone misses).
    """
    options = list(choices)
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.7)
    if not close:
        close = [c for c in options if _swapped(word.lower(), c.lower())][:1]
    return f"; did you mean {close[0]!r}?" if close else ""


def _swapped(a: str, b: str) -> bool:
    if a == b:
        return True
    if len(a) != len(b):
        return False
    diff = [i for i in range(len(a)) if a[i] != b[i]]
    return len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]]


def reference_problems(
    backends: Sequence[str | None],
    models: Sequence[tuple[str | None, Sequence[str | None]]],
    key_models: Sequence[Sequence[str | None]] | None = None,
) -> list[Problem]:
    """Duplicate backend and model names, routes to undefined backends, key model globs that match nothing.

    ``backends``: each entry's name; ``models``: each model's name and its routes' backends;
    ``key_models``: each ``auth.keys[]`` entry's ``models`` (None: no ``auth``). A None is a
    name that is missing or not a string (reported elsewhere) and is skipped.
    """
    problems: list[Problem] = []
    defined: dict[str, int] = {}
    for i, name in enumerate(backends):
        if name is None:
            continue
        if name in defined:
            problems.append(
                (f"backends[{i}].name", f"duplicate backend name {name!r} (first at backends[{defined[name]}])")
            )
        else:
            defined[name] = i
    seen: dict[str, int] = {}
    for i, (name, routes) in enumerate(models):
        if name is not None:
            if name in seen:
                problems.append((f"models[{i}].name", f"duplicate model name {name!r} (first at models[{seen[name]}])"))
            else:
                seen[name] = i
        for j, backend in enumerate(routes):
            if backend is not None and backend not in defined:
                problems.append(
                    (
                        f"models[{i}].routes[{j}].backend",
                        f"no backend named {backend!r}{did_you_mean(backend, defined)} "
                        f"(defined: {', '.join(sorted(defined))})",
                    )
                )
    names = [name for name, _ in models if name is not None]
    for i, patterns in enumerate(key_models or ()):
        for j, pattern in enumerate(patterns):
            if pattern is not None and not any(fnmatch.fnmatchcase(name, pattern) for name in names):
                problems.append(
                    (
                        f"auth.keys[{i}].models[{j}]",
                        f"{pattern!r} matches no configured model{did_you_mean(pattern, names)}",
                    )
                )
    return problems


def _name(item: Any, key: str = "name") -> str | None:
    value = item.get(key) if isinstance(item, dict) else None
    return value if isinstance(value, str) else None


def _items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def raw_reference_problems(data: dict[str, Any]) -> list[Problem]:
    """:func:`reference_problems` on the YAML as read (after ``${VAR}``s), whatever else is wrong in it."""
    models = [
        (_name(m), [_name(r, "backend") for r in _items(m.get("routes"))] if isinstance(m, dict) else [])
        for m in _items(data.get("models"))
    ]
    auth = data.get("auth")
    keys = None
    if isinstance(auth, dict):
        keys = [
            [p if isinstance(p, str) else None for p in _items(k.get("models"))] if isinstance(k, dict) else []
            for k in _items(auth.get("keys"))
        ]
    return reference_problems([_name(b) for b in _items(data.get("backends"))], models, keys)
