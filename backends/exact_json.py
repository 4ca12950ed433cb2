"""JSON of upstream answers read and written without changing a number.

orjson, the gateway's JSON codec, reads an integer outside ``[-2**63, 2**64)`` as a float and
cannot write one, nor nest past 255 levels. An upstream's answer may carry such integers (ids,
``created``, ``token_ids``, tool-call arguments): wherever the gateway parses an answer and
writes it again, these helpers keep them exact, paying the slower stdlib codec only for the
bodies that need it. Shared by every backend family (OpenAI relay, vLLM, native servers).
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from backends.errors import UpstreamProtocolError

__all__ = ["dumps_exact", "loads_exact", "loads_keeping_integers", "may_hold_long_int"]

# orjson reads integers outside [-2**63, 2**64) as floats; the shortest, -2**63 - 1, has 19 digits
# (a 19-digit run that fits, or a float's, only costs the slower exact parse). The scan: every
# digit becomes "0", then one search for 19 of them (a tenth of a regex's time: 0.4 us for a
# 350-byte body, 10 us for 11 KB of logprobs, where \d{19} took 3 and 117).
_DIGITS_TO_ZERO = bytes(0x30 if 0x30 <= i <= 0x39 else i for i in range(256))
_LONG_RUN = b"0" * 19


def may_hold_long_int(data: bytes) -> bool:
    """Whether ``data`` has a run of 19+ digits, the shortest integer orjson reads as a float."""
    return _LONG_RUN in data.translate(_DIGITS_TO_ZERO)


def loads_keeping_integers(data: bytes, backend: str) -> Any:
    """``data`` parsed (orjson; raises ``orjson.JSONDecodeError``), read again exactly where it may
    hold an integer orjson turned into a float."""
    obj = orjson.loads(data)
    return loads_exact(data, backend) if may_hold_long_int(data) else obj


def loads_exact(data: bytes, backend: str) -> Any:
    """``data`` (valid JSON) parsed with every integer kept exact: the stdlib parser, slower, used only where needed.

    An integer too long for Python to read (over 4300 digits) or nesting deeper than its
    recursion limit is refused with a 502 naming it.
    """
    try:
        return json.loads(data)
    except ValueError:
        raise UpstreamProtocolError("the upstream sent an integer too long to relay", backend=backend) from None
    except RecursionError:
        raise UpstreamProtocolError("the upstream sent JSON nested too deeply to relay", backend=backend) from None


def dumps_exact(obj: Any, backend: str, what: str = "a body") -> bytes:
    """``obj`` serialised, integers beyond 64 bits and nesting past orjson's 255 levels through the stdlib.

    Deeper than the stdlib goes (its recursion limit) is a 502 naming ``what``.
    """
    try:
        return orjson.dumps(obj)
    except orjson.JSONEncodeError:
        pass
    try:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()
    except (RecursionError, ValueError):
        raise UpstreamProtocolError(f"the upstream sent {what} nested too deeply to relay", backend=backend) from None
