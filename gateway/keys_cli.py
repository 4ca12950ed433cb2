"""``gateway keys usage``: each API key's spend (today, this month, in total) and its budget.

Reads the same config file the gateway serves. With ``auth.store`` set to Redis it reads the
counters there directly (every worker's and replica's spend; the gateway need not be running);
with the in-memory store it asks the running gateway's ``GET /admin/keys`` with the admin key
(``auth.admin_key``, or ``--admin-key`` / ``GATEWAY_ADMIN_KEY`` when the config holds only its digest).
Spend is in the currency of ``models[].pricing``. Exit status: 0 when it could read the spend, else 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any

from gateway.configfile import ConfigError, load_config
from gateway.spend.budgets import Budget, SpendLedger, shared_spend_store
from schemas.config import GatewayConfig

__all__ = ["add_keys_parser", "keys_command"]


def add_keys_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = sub.add_parser("keys", help="inspect the API keys of a gateway")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    usage = keys_sub.add_parser("usage", help="each key's spend today, this month and in total, and its budget")
    usage.add_argument("--config", "-c", required=True, help="the YAML the gateway serves")
    usage.add_argument("--url", help="the running gateway (memory store); default: server.host:server.port")
    usage.add_argument("--admin-key", default=os.environ.get("GATEWAY_ADMIN_KEY"), help="default: auth.admin_key")
    usage.add_argument("--json", action="store_true", help="print the raw objects")


def keys_command(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    auth = config.auth
    if auth is None:
        print(f"{args.config}: no auth section, so no keys", file=sys.stderr)
        return 1
    try:
        if auth.store_url is not None:
            rows = asyncio.run(_from_redis(config, auth.store_url))
        else:
            rows = _from_gateway(config, args)
    except (OSError, urllib.error.URLError, ValueError) as exc:
        print(f"cannot read the keys' spend: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(format_table(rows))
    return 0


async def _from_redis(config: GatewayConfig, url: str) -> list[dict[str, Any]]:
    assert config.auth is not None
    counters = shared_spend_store(url, prefix=config.auth.store_prefix, timeout=max(config.auth.redis_timeout, 2.0))
    budgets = {k.name: Budget.of(k.budget) for k in config.auth.keys if k.budget is not None}
    ledger = SpendLedger(budgets, counters)
    try:
        return await ledger.usage(k.name for k in config.auth.keys)
    finally:
        await counters.close()


def _from_gateway(config: GatewayConfig, args: argparse.Namespace) -> list[dict[str, Any]]:
    assert config.auth is not None
    key = args.admin_key or (config.auth.admin_key.get_secret_value() if config.auth.admin_key else None)
    if key is None:
        raise ValueError("the in-memory store is read through GET /admin/keys: give --admin-key or auth.admin_key")
    server = config.server
    host = "127.0.0.1" if server.host in ("0.0.0.0", "::", "") else server.host
    url = (args.url or f"http://{host}:{server.port}").rstrip("/") + "/admin/keys"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        rows: list[dict[str, Any]] = json.loads(resp.read())["data"]
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    head = ("key", "today", "this month", "total", "budget", "remaining", "resets at")
    lines: list[tuple[str, ...]] = [head]
    for row in rows:
        spent, budget = row["spent"], row["budget"]
        if budget is None:
            tail: tuple[str, ...] = ("-", "-", "-")
        else:
            per = {"day": "/day", "month": "/month"}.get(budget["period"], " total")
            left = budget["remaining"] + (" (spent)" if budget["exceeded"] else "")
            tail = (budget["amount"] + per, left, budget["resets_at"] or "never")
        lines.append((row["key"], spent["day"], spent["month"], spent["total"], *tail))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines)
