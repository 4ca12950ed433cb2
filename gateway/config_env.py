"""``${VAR}`` references in the config's string values, read from the environment as shells and compose do.

| written | unset | set but empty |
|---|---|---|
| ``${VAR}`` | a problem ("is not set") | ``""`` |
| ``${VAR:-default}`` / ``${VAR-default}`` | ``default`` | ``default`` / ``""`` |
| ``${VAR:?message}`` / ``${VAR?message}`` | a problem naming ``message`` | a problem / ``""`` |
| ``${VAR:+other}`` / ``${VAR+other}`` | ``""`` | ``""`` / ``other`` |

A default may hold references itself (``${HOST:-${FALLBACK_HOST}}``), read only when used.
``$${`` is a literal ``${``. Values from the environment are never read again for references.
Only mapping values and list items are read (keys are not), and only strings: ``port: ${PORT}``
becomes the string ``"8080"``, which the config's models then validate as a number.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["interpolate", "interpolate_tree"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPERATORS = (":-", ":?", ":+", "-", "?", "+")
_FORMS = "${NAME}, ${NAME:-default} or ${NAME:?message} ($${ is a literal ${)"


class _Malformed(Exception):
    pass


def interpolate(text: str, env: Mapping[str, str], problems: list[str]) -> str:
    """``text`` with its references replaced; each one that cannot be is described in ``problems``."""
    if "${" not in text:
        return text
    try:
        value, _ = _value(text, 0, env, problems, nested=False)
    except _Malformed as exc:
        problems.append(str(exc))
        return text
    return value


def interpolate_tree(node: Any, env: Mapping[str, str], problems: list[tuple[str, str]], path: str = "") -> Any:
    """Every string in a YAML tree interpolated; ``problems`` gets ``(yaml_path, message)`` pairs."""
    if isinstance(node, str):
        found: list[str] = []
        value = interpolate(node, env, found)
        problems.extend((path, message) for message in found)
        return value
    if isinstance(node, dict):
        return {key: interpolate_tree(v, env, problems, _join(path, str(key))) for key, v in node.items()}
    if isinstance(node, list):
        return [interpolate_tree(v, env, problems, f"{path}[{i}]") for i, v in enumerate(node)]
    return node


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _value(text: str, i: int, env: Mapping[str, str], problems: list[str], *, nested: bool) -> tuple[str, int]:
    """Text from ``i`` up to its end (or, ``nested``, up to the ``}`` that closes a reference)."""
    out: list[str] = []
    while i < len(text):
        if text.startswith("$${", i):
            out.append("${")
            i += 3
        elif text.startswith("${", i):
            value, i = _reference(text, i + 2, env, problems)
            out.append(value)
        elif nested and text[i] == "}":
            return "".join(out), i
        else:
            # Up to the next character that can matter, in one slice.
            stop = len(text)
            for mark in ("$", "}") if nested else ("$",):
                found = text.find(mark, i + 1)
                if found != -1:
                    stop = min(stop, found)
            out.append(text[i:stop])
            i = stop
    if nested:
        raise _Malformed(f"a '${{' is never closed with '}}' (write {_FORMS})")
    return "".join(out), i


def _reference(text: str, i: int, env: Mapping[str, str], problems: list[str]) -> tuple[str, int]:
    """One reference whose ``${`` ends before ``i``; returns its value and the index after its ``}``."""
    match = _NAME.match(text, i)
    if match is None:
        raise _Malformed(f"'${{' is not followed by a variable name (write {_FORMS})")
    name, i = match.group(), match.end()
    if text.startswith("}", i):
        if name not in env:
            problems.append(f"environment variable {name} is not set")
            return "", i + 1
        return env[name], i + 1
    operator = next((op for op in _OPERATORS if text.startswith(op, i)), None)
    if i == len(text):
        raise _Malformed(f"a '${{' is never closed with '}}' (write {_FORMS})")
    if operator is None:
        raise _Malformed(f"'${{{name}' is followed by {text[i : i + 1]!r} (write {_FORMS})")
    # The word is read (its own references checked) only where it is used.
    word_problems: list[str] = []
    word, i = _value(text, i + len(operator), env, word_problems, nested=True)
    value = env.get(name)
    missing = value is None or (operator.startswith(":") and value == "")
    kind = operator[-1]
    if kind == "-":
        if missing:
            problems.extend(word_problems)
            return word, i + 1
        return value or "", i + 1
    if kind == "?":
        if missing:
            problems.extend(word_problems)
            state = "not set" if value is None else "empty"
            problems.append(f"environment variable {name} is {state}: {word or 'required'}")
            return "", i + 1
        return value or "", i + 1
    if missing:  # "+": the word when set
        return "", i + 1
    problems.extend(word_problems)
    return word, i + 1
