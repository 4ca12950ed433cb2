"""Reading the YAML config file: ``${VAR}`` references, then validation, every problem at once.

Every mistake is reported with the file, line and column and the YAML path where it sits
(``gateway.yaml:9:5: backends[1].baseurl: unknown key; did you mean 'base_url'?``), schema
errors and cross-references together, so ``gateway check-config`` can list them and
``gateway serve`` can refuse to start. References: :mod:`gateway.config_env`; the wording:
:mod:`gateway.config_report`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import yaml
from pydantic import ValidationError

from backends.registry import backend_class
from gateway.config_env import interpolate_tree
from gateway.config_report import ConfigError, Positions, validation_problems
from gateway.flow.router import endpoint_problems
from schemas.config import GatewayConfig
from schemas.config.references import raw_reference_problems

__all__ = ["ConfigError", "config_error", "load_config", "parse_config"]


def parse_config(text: str, source: str = "<config>", env: Mapping[str, str] | None = None) -> GatewayConfig:
    """Parse and validate config text; raise :class:`ConfigError` listing every problem."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = Positions.point(mark.line + 1, mark.column + 1) if mark is not None else None
        raise ConfigError(source, [("", f"invalid YAML: {getattr(exc, 'problem', None) or exc}")], at) from None
    positions = Positions(text)
    if not isinstance(data, dict):
        raise ConfigError(source, [("", "the config must be a mapping with 'backends' and 'models'")])
    problems: list[tuple[str, str]] = []
    data = interpolate_tree(data, os.environ if env is None else env, problems)
    try:
        config = GatewayConfig.model_validate(data)
    except ValidationError as exc:
        # A value left empty by a missing variable is reported once, as the variable.
        unset = {path for path, _ in problems}
        problems += [p for p in validation_problems(exc, data) if p[0] not in unset]
        if not any(item["loc"] == () for item in exc.errors(include_url=False)):
            # The file-wide checks did not run (a part failed first): run them on the raw names.
            known = {path for path, _ in problems}
            problems += [p for p in raw_reference_problems(data) if p[0] not in known]
    else:
        if not problems:
            return config
    raise ConfigError(source, problems, positions)


def endpoint_config_problems(config: GatewayConfig) -> list[tuple[str, str]]:
    """``models[].endpoints`` against what the routes' adapter classes declare they serve
    (``gateway check-config``; ``create_app`` checks the built backends themselves)."""
    return endpoint_problems(config, lambda name: backend_class(config.backend(name)).endpoints)


def config_error(path: str | Path, problems: list[tuple[str, str]]) -> ConfigError:
    """Problems found in a loaded config, with their positions in its file (read again)."""
    try:
        positions: Positions | None = Positions(Path(path).read_text(encoding="utf-8"))
    except OSError:
        positions = None
    return ConfigError(str(path), problems, positions)


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> GatewayConfig:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(path), [("", f"cannot read file: {exc.strerror or exc}")]) from None
    return parse_config(text, str(path), env)
