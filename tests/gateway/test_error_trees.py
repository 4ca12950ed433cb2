"""The two error trees (``schemas/errors.py``, ``backends/errors.py``) name every error class a client
can be answered with: ``error.type`` in spans and the error metrics read from them, so a class raised
somewhere and missing there is a type nobody documented. The test imports every product module and
walks :class:`GatewayError`'s subclasses."""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Iterator

import backends.errors
import schemas.errors
from schemas.errors import GatewayError


def _subclasses(cls: type[GatewayError]) -> Iterator[type[GatewayError]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_every_error_class_is_in_a_tree() -> None:
    for package in ("schemas", "backends", "gateway"):
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, package + "."):
            if not info.name.endswith("__main__"):
                importlib.import_module(info.name)
    trees = f"{schemas.errors.__doc__}\n{backends.errors.__doc__}"
    classes = set(_subclasses(GatewayError))
    assert len(classes) > 25  # the walk found the product's classes
    missing = sorted(f"{c.__module__}.{c.__name__}" for c in classes if not re.search(rf"\b{c.__name__}\b", trees))
    assert missing == []
    # each tree line names the status the class answers with (an upstream's status error: the upstream's)
    for cls in classes - {backends.errors.UpstreamStatusError}:
        line = next(line for line in trees.splitlines() if re.search(rf"\b{cls.__name__}\b", line))
        assert str(cls.status) in line, (cls.__name__, line)
