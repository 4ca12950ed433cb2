"""Request ids and rate-limit lease ids stay unique when the gateway process forks.

Each is a random per-process prefix plus a counter. Made once at import, a forked child
(a pre-fork worker) would repeat its parent's ids: two requests with one id in the logs,
and in Redis one worker's release freeing another worker's concurrency slot. The fork
runs in a fresh interpreter, not in the test process (which may have threads).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_FORK = """
import json, os
from gateway.security.ratelimit.base import new_lease as _lease
from gateway.http.request_id import new_request_id

def ids():
    return [new_request_id(), new_request_id(), _lease(), _lease()]

parent_before = ids()
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(w, json.dumps(ids()).encode())
    os._exit(0)
os.close(w)
child = json.loads(os.read(r, 65536))
os.waitpid(pid, 0)
print(json.dumps({"parent": parent_before + ids(), "child": child}))
"""


def test_a_forked_child_makes_ids_of_its_own() -> None:
    out = subprocess.run([sys.executable, "-c", _FORK], cwd=ROOT, capture_output=True, check=True, timeout=60)
    got = json.loads(out.stdout)
    parent, child = got["parent"], got["child"]
    assert not set(parent) & set(child), (parent, child)
    # The prefixes differ, not just the counters: the parent keeps counting after the fork.
    rid_prefix = child[0][:-8]
    lease_prefix = child[2].rsplit("-", 1)[0]
    assert all(not p.startswith(rid_prefix) for p in parent[:2] + parent[4:6])
    assert all(not p.startswith(lease_prefix + "-") for p in parent[2:4] + parent[6:8])
    # The formats are unchanged (logs and Redis keys parse them).
    assert child[0].startswith("req-") and len(child[0]) == len("req-") + 12 + 8
    assert child[2].endswith("-1") and len(lease_prefix) == 12
