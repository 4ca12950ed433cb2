"""What is wrong with a config file, said the way an editor and an operator can act on it.

Each problem is a YAML path and a message (``backends[1].baseurl: unknown key; did you mean
'base_url'?``). :class:`ConfigError` holds them all, and, when the file's text is known, where
each sits: ``gateway.yaml:14:5: backends[1].baseurl: ...`` (the compiler form editors link).
:func:`validation_problems` turns pydantic's errors into such problems: the value shown
(``(got 'eighty')``) unless the field is a secret, and for an unknown key, backend type or
choice the nearest valid one.
"""

from __future__ import annotations

import functools
import re
import types
from collections.abc import Iterator, Sequence
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, SecretStr, ValidationError

from schemas.config import BACKEND_TYPES, GatewayConfig
from schemas.config.references import ConfigProblems, did_you_mean

__all__ = ["ConfigError", "Positions", "join_path", "validation_problems"]

Problem = tuple[str, str]
UNKNOWN_KEY = "unknown key"  # how such a problem's message starts: it is placed at the key
_SHOWN_CHARS = 60


class Positions:
    """Where each YAML path of a file sits: 1-based ``(line, column)`` of its key and of its value."""

    def __init__(self, text: str) -> None:
        self._values: dict[str, tuple[int, int]] = {}
        self._keys: dict[str, tuple[int, int]] = {}
        self._scalars: set[str] = set()
        try:
            root = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.YAMLError:
            return
        if root is not None:
            self._walk(root, "")

    @classmethod
    def point(cls, line: int, column: int) -> Positions:
        """Every path at one place (a file that is not YAML: where the parser stopped)."""
        positions = cls("")
        positions._values[""] = (line, column)
        return positions

    def _walk(self, node: yaml.Node, path: str) -> None:
        self._values.setdefault(path, (node.start_mark.line + 1, node.start_mark.column + 1))
        if isinstance(node, yaml.ScalarNode):
            self._scalars.add(path)
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value != "<<":
                    child = join_path(path, key.value)
                    self._keys.setdefault(child, (key.start_mark.line + 1, key.start_mark.column + 1))
                    self._walk(value, child)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self._walk(item, join_path(path, i))

    def of(self, path: str, *, key: bool = False) -> tuple[int, int] | None:
        """A scalar's own position, else (or with ``key``) its key's: a block value starts a line
        later. For a path the file lacks (a missing key), the nearest enclosing one."""
        while True:
            if (path in self._scalars and not key) or path not in self._keys:
                found = self._values.get(path)
            else:
                found = self._keys[path]
            if found is not None or not path:
                return found
            path = _parent(path)


def _parent(path: str) -> str:
    cut = max(path.rfind("."), path.rfind("["))
    return path[:cut] if cut > 0 else ""


def join_path(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


class ConfigError(Exception):
    """A config file that cannot be used; ``problems`` holds ``(yaml_path, message)`` pairs.

    ``positions`` (the file's :class:`Positions`) adds ``line:column`` to each when known.
    """

    def __init__(self, source: str, problems: list[Problem], positions: Positions | None = None) -> None:
        self.source = source
        self.problems = problems
        self.positions = positions
        super().__init__(f"{source}: {len(problems)} problem(s)\n" + "\n".join(f"  {line}" for line in self.lines()))

    def lines(self) -> list[str]:
        """One line per problem, in the file's order: ``file:line:column: path: message`` (without a
        position: ``file: path: message``). An unknown key is placed at the key, other problems at the value."""
        located = []
        for n, (path, message) in enumerate(self.problems):
            at = None
            if self.positions is not None:
                at = self.positions.of(path, key=message.startswith(UNKNOWN_KEY))
            where = f"{self.source}:{at[0]}:{at[1]}: " if at is not None else f"{self.source}: "
            located.append((at or (0, 0), n, f"{where}{path or '<root>'}: {message}"))
        return [line for *_, line in sorted(located)]


# --- pydantic's errors as problems ------------------------------------------------------------------


def validation_problems(error: ValidationError, data: Any) -> list[Problem]:
    """Every error in ``error`` (raised validating ``data``) at its YAML path, with advice."""
    problems: list[Problem] = []
    secrets = _secret_values(data, "")
    for item in error.errors(include_url=False):
        loc = tuple(item["loc"])
        kind = item["type"]
        message = item["msg"]
        ctx = item.get("ctx") or {}
        path = _loc_to_path(loc, data)
        if kind == "value_error" and isinstance(ctx.get("error"), ConfigProblems):
            problems.extend(ctx["error"].problems)  # a model-level rule: each names its own path
            continue
        if kind == "extra_forbidden":
            problems.append((path, _unknown_key(loc)))
            continue
        if kind == "union_tag_invalid":
            tag = str(ctx.get("tag"))
            advice = did_you_mean(tag, BACKEND_TYPES) or f" (one of {', '.join(BACKEND_TYPES)})"
            problems.append((join_path(path, "type"), f"unknown backend type {tag!r}{advice}"))
            continue
        if kind == "union_tag_not_found":
            problems.append((path, f"missing 'type' (one of {', '.join(BACKEND_TYPES)})"))
            continue
        if kind == "value_error":
            text = message.removeprefix("Value error, ")
            head, _, rest = text.partition(": ")
            if rest and re.fullmatch(r"[A-Za-z_][\w.\[\]]*", head):
                problems.append((head, rest))  # "models[0].routes[1].backend: ..." names its own path
                continue
            message = text
        if kind in ("literal_error", "enum") and not _is_secret(path):
            choices = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
            near = did_you_mean(str(item.get("input")), choices)
            if near:  # the one choice meant says more than the list of all
                problems.append((path, f"{item.get('input')!r} is not one of the choices{near}"))
                continue
        problems.append((path, f"{message}{_shown(path, kind, item.get('input'), message, secrets)}"))
    return problems


def _loc_to_path(loc: tuple[int | str, ...], data: Any) -> str:
    """Turn a pydantic error location into a YAML path, dropping union-tag segments."""
    path = ""
    node = data
    for depth, part in enumerate(loc):
        if depth == 2 and loc[0] == "backends" and part in BACKEND_TYPES:
            # The discriminator tag pydantic inserts: ("backends", i, "<type>", ...). Judged by
            # position, not by absence from the data, so a stray key named like the type
            # (``openai: ...`` inside an openai backend) still gets its own path.
            continue
        if isinstance(node, dict) and part in node:
            # Before the int case: a YAML mapping key may be an int (``8080: x``), not an index.
            path = join_path(path, str(part))
            node = node[part]
        elif isinstance(part, int):
            path = join_path(path, part)
            node = node[part] if isinstance(node, list) and part < len(node) else None
        else:
            path = join_path(path, part)
            node = None
    return path


def _shown(path: str, kind: str, value: Any, message: str, secrets: set[str]) -> str:
    """`` (got 'x')`` for a scalar input the message does not already quote; never a secret.

    Hidden: any value of a secret field, any value holding a secret given elsewhere in the
    file, and a long string where a number or a boolean belongs (a key pasted one line off).
    """
    if kind == "missing" or not isinstance(value, str | int | float | bool) or str(value) in message:
        return ""
    if _is_secret(path) or (isinstance(value, str) and any(secret in value for secret in secrets)):
        return " (got a secret value, not shown)"
    if isinstance(value, str) and len(value) > 12 and kind.split("_")[0] in ("int", "float", "bool", "greater", "less"):
        return f" (got a {len(value)}-character string, not shown)"
    text = repr(value)
    if len(text) > _SHOWN_CHARS:
        text = text[: _SHOWN_CHARS - 3] + "..."
    return f" (got {text})"


def _secret_values(node: Any, path: str) -> set[str]:
    """The strings the file gives to secret fields (8 characters or more), to hide wherever they appear."""
    if isinstance(node, dict):
        return {s for key, value in node.items() for s in _secret_values(value, join_path(path, str(key)))}
    if isinstance(node, list):
        return {s for i, value in enumerate(node) for s in _secret_values(value, join_path(path, i))}
    if isinstance(node, str) and len(node) >= 8 and _is_secret(path):
        return {node}
    return set()


def _is_secret(path: str) -> bool:
    names = re.findall(r"[A-Za-z_][\w-]*", re.sub(r"\[\d+\]", "", path))
    return any(name in _secret_fields() for name in names)


@functools.cache
def _secret_fields() -> frozenset[str]:
    """Every config field whose value is a secret (a ``SecretStr``, or a mapping of them)."""
    found: set[str] = set()
    seen: set[type[BaseModel]] = set()

    def visit(model: type[BaseModel]) -> None:
        if model in seen:
            return
        seen.add(model)
        for name, field in model.model_fields.items():
            if SecretStr in set(_leaves(field.annotation)):
                found.add(name)
            for leaf in _leaves(field.annotation):
                if isinstance(leaf, type) and issubclass(leaf, BaseModel):
                    visit(leaf)

    visit(GatewayConfig)
    return frozenset(found)


def _leaves(annotation: Any) -> Iterator[Any]:
    """The types inside an annotation (through Annotated, unions, lists, dicts, tuples)."""
    origin = get_origin(annotation)
    if origin is None:
        yield annotation
        return
    if origin is Literal:
        return
    args = get_args(annotation)
    for arg in args[:1] if origin is Annotated else args:
        yield from _leaves(arg)


# --- unknown keys: the valid ones near the typo -----------------------------------------------------


def _unknown_key(loc: tuple[int | str, ...]) -> str:
    key = str(loc[-1])
    fields = _fields_at(loc[:-1])
    if not fields:
        return UNKNOWN_KEY
    near = did_you_mean(key, fields)
    return f"{UNKNOWN_KEY}{near}" if near else f"{UNKNOWN_KEY} (expected one of: {', '.join(fields)})"


def _fields_at(loc: Sequence[int | str]) -> list[str]:
    """The keys the model at ``loc`` (a pydantic location, union tags included) accepts."""
    current: Any = GatewayConfig
    for part in loc:
        current = _step(current, part)
        if current is None:
            return []
    models = [alt for alt in _alternatives(current) if isinstance(alt, type) and issubclass(alt, BaseModel)]
    return list(models[0].model_fields) if len(models) == 1 else []


def _alternatives(annotation: Any) -> list[Any]:
    origin = get_origin(annotation)
    if origin is Annotated:
        return _alternatives(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return [alt for arg in get_args(annotation) for alt in _alternatives(arg)]
    return [annotation]


def _step(annotation: Any, part: int | str) -> Any:
    for alt in _alternatives(annotation):
        origin = get_origin(alt)
        if isinstance(alt, type) and issubclass(alt, BaseModel) and isinstance(part, str):
            tag = alt.model_fields.get("type")
            if tag is not None and part in get_args(tag.annotation):
                return alt  # the discriminated union's tag: this member
            if part in alt.model_fields:
                return alt.model_fields[part].annotation
        elif origin is list and isinstance(part, int):
            return get_args(alt)[0]
        elif origin is dict and isinstance(part, str):
            return get_args(alt)[1]
    return None
