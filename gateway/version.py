"""The gateway's version: the installed package's, for ``gateway --version``, ``GET /version``,
the ``gateway_build_info`` metric and the start-up log line. A leaf module (standard library only)."""

from __future__ import annotations

import platform
from functools import cache
from importlib.metadata import PackageNotFoundError, version

__all__ = ["DISTRIBUTION", "PYTHON_VERSION", "gateway_version"]

DISTRIBUTION = "completions-gateway"  # pyproject.toml's [project] name
PYTHON_VERSION = platform.python_version()


@cache
def gateway_version() -> str:
    """The installed distribution's version (``0+unknown`` when run from a tree that is not installed)."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "0+unknown"
