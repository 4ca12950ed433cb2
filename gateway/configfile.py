"""Reading the YAML config file: ``${VAR}`` interpolation, then validation.

Every mistake is reported with the YAML path where it sits
(``backends[1].base_url: ...``), all at once, so ``gateway check-config`` can
list them and ``gateway serve`` can refuse to start.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from backends.registry import backend_class
from gateway.flow.router import endpoint_problems
from schemas.config import BACKEND_TYPES, GatewayConfig

__all__ = ["ConfigError", "load_config", "parse_config"]

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class ConfigError(Exception):
    """A config file that cannot be used; ``problems`` holds ``(yaml_path, message)`` pairs."""

    def __init__(self, source: str, problems: list[tuple[str, str]]) -> None:
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  {path or '<root>'}: {message}" for path, message in problems)
        super().__init__(f"{source}: {len(problems)} problem(s)\n{lines}")


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def _interpolate(node: Any, path: str, env: Mapping[str, str], problems: list[tuple[str, str]]) -> Any:
    if isinstance(node, str):

        def substitute(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in env:
                problems.append((path, f"environment variable {name} is not set"))
                return ""
            return env[name]

        return _VAR.sub(substitute, node)
    if isinstance(node, dict):
        return {key: _interpolate(value, _join(path, str(key)), env, problems) for key, value in node.items()}
    if isinstance(node, list):
        return [_interpolate(value, _join(path, i), env, problems) for i, value in enumerate(node)]
    return node


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
            path = _join(path, str(part))
            node = node[part]
        elif isinstance(part, int):
            path = _join(path, part)
            node = node[part] if isinstance(node, list) and part < len(node) else None
        else:
            path = _join(path, part)
            node = None
    return path


def _validation_problems(error: ValidationError, data: Any) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    for item in error.errors(include_url=False):
        loc = tuple(item["loc"])
        kind = item["type"]
        message = item["msg"]
        if kind == "extra_forbidden":
            message = "unknown key"
        elif kind == "union_tag_invalid":
            tag = item.get("ctx", {}).get("tag")
            message = f"unknown backend type {tag!r} (expected one of {', '.join(BACKEND_TYPES)})"
        elif kind == "union_tag_not_found":
            message = f"missing 'type' (one of {', '.join(BACKEND_TYPES)})"
        elif kind == "value_error" and ": " in message:
            # Model-level rules name their own path: "Value error, models[0].routes[1].backend: ..."
            text = message.removeprefix("Value error, ")
            head, _, rest = text.partition(": ")
            if re.fullmatch(r"[A-Za-z_][\w.\[\]]*", head):
                problems.append((head, rest))
                continue
            message = text
        elif kind == "value_error":
            message = message.removeprefix("Value error, ")
        problems.append((_loc_to_path(loc, data), message))
    return problems


def parse_config(text: str, source: str = "<config>", env: Mapping[str, str] | None = None) -> GatewayConfig:
    """Parse and validate config text; raise :class:`ConfigError` listing every problem."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(source, [(where, f"invalid YAML: {getattr(exc, 'problem', None) or exc}")]) from None
    if not isinstance(data, dict):
        raise ConfigError(source, [("", "the config must be a mapping with 'backends' and 'models'")])
    problems: list[tuple[str, str]] = []
    data = _interpolate(data, "", os.environ if env is None else env, problems)
    if problems:
        raise ConfigError(source, problems)
    try:
        return GatewayConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, _validation_problems(exc, data)) from None


def endpoint_config_problems(config: GatewayConfig) -> list[tuple[str, str]]:
    """``models[].endpoints`` against what the routes' adapter classes declare they serve
    (``gateway check-config``; ``create_app`` checks the built backends themselves)."""
    return endpoint_problems(config, lambda name: backend_class(config.backend(name)).endpoints)


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> GatewayConfig:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(path), [("", f"cannot read file: {exc.strerror or exc}")]) from None
    return parse_config(text, str(path), env)
