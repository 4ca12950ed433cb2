"""The serving process's collector settings (gateway.http.heap), checked in a fresh interpreter:
they are process-wide, so the test process's own are left alone."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

_PROBE = """
import gc, json, weakref
from gateway.http.heap import YOUNG_THRESHOLD, settle_heap

class Node:
    pass

before = {"threshold": gc.get_threshold(), "frozen": gc.get_freeze_count()}
node = Node()
node.me = node  # cyclic garbage from start-up: collected before the freeze, never frozen
dead = weakref.ref(node)
del node
settle_heap()
frozen = gc.get_freeze_count()
settle_heap()  # once per process
print(json.dumps({
    "before": before,
    "threshold": gc.get_threshold(),
    "frozen": frozen,
    "frozen_again": gc.get_freeze_count(),
    "young": YOUNG_THRESHOLD,
    "cycle_collected": dead() is None,
}))
"""


def _probe() -> Any:
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=60)
    return json.loads(out.stdout)


def test_settle_heap_freezes_the_live_start_up_heap_and_spaces_out_young_collections() -> None:
    result = _probe()
    assert result["before"]["frozen"] == 0
    assert result["frozen"] > 1000  # modules, classes, functions: the start-up heap
    assert result["frozen_again"] == result["frozen"]  # the second call does nothing
    assert result["cycle_collected"]  # garbage was collected first, not kept frozen
    young, older, oldest = result["threshold"]
    assert young == result["young"] > result["before"]["threshold"][0]
    assert [older, oldest] == result["before"]["threshold"][1:]
