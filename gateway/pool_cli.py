"""``gateway pool status``: each pool worker's state, read from the pools' status files.

A running ``vllm-pool`` backend keeps ``<log_dir>/status.json`` current (see
``backends.vllm.routing.status``); this command finds it from the same config file the
gateway serves, so it needs no admin endpoint and works while the gateway is busy.
With ``gateway serve --workers N`` the control process runs the pool and writes the file; the
table then says how many calls each gateway worker (``g0`` .. ``gN-1``) has in flight per vLLM worker.
Exit status: 0 when every pool asked about has a status from a live gateway, else 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from backends.vllm.pool import pool_log_dir
from backends.vllm.routing.status import PoolStatus, format_table, read_status
from gateway.configfile import ConfigError, load_config
from schemas.config import VLLMPoolBackendConfig

__all__ = ["add_pool_parser", "pool_command"]


def add_pool_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pool = sub.add_parser("pool", help="inspect the vllm-pool backends of a running gateway")
    pool_sub = pool.add_subparsers(dest="pool_command", required=True)
    status = pool_sub.add_parser("status", help="each worker: state, GPUs, port, pid, uptime, restarts, load")
    status.add_argument("--config", "-c", required=True, help="the YAML the gateway serves")
    status.add_argument("--backend", help="only this vllm-pool backend")
    status.add_argument("--json", action="store_true", help="print the raw status objects")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pool_command(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    pools = [b for b in config.backends if isinstance(b, VLLMPoolBackendConfig)]
    if args.backend:
        pools = [b for b in pools if b.name == args.backend]
    if not pools:
        what = f"no vllm-pool backend named {args.backend!r}" if args.backend else "no vllm-pool backend"
        print(f"{args.config}: {what}", file=sys.stderr)
        return 1
    ok = True
    found: list[PoolStatus] = []
    for pool in pools:
        path = pool_log_dir(pool) / "status.json"
        try:
            status = read_status(path)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            ok = False
            print(f"pool {pool.name}: no status at {path} ({exc}); is the gateway running?", file=sys.stderr)
            continue
        found.append(status)
        live = _alive(status.gateway_pid)
        ok = ok and live
        if args.json:
            continue
        age = time.time() - status.updated_at
        note = f"gateway pid {status.gateway_pid}, updated {age:.0f}s ago"
        gateways = max((len(w.in_flight_by) for w in status.workers), default=0)
        if gateways:  # --workers N: the control process runs the pool, its gateway workers route
            note = f"control process pid {status.gateway_pid} of {gateways} gateway workers, updated {age:.0f}s ago"
        if not live:
            note += "; the gateway is NOT running (last known status)"
        print(f"pool {pool.name} ({pool.served_name}): {note}")
        print(format_table(status))
        print()
    if args.json:
        print(json.dumps([s.to_json() for s in found], indent=1))
    return 0 if ok else 1
