"""Medians across repeats and the markdown tables for bench/run.py."""

from __future__ import annotations

import statistics
from typing import Any

LITTLE_BELOW = 5


def ratio(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.3f}"


def median(rows: list[dict[str, Any]], key: str) -> Any:
    values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return statistics.median(values) if values else None


def fmt(v: Any, nd: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and v.is_integer() and abs(v) >= 1:
        v = int(v)
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.{nd}f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def summarise(
    results: list[dict[str, Any]],
    targets: list[str],
    scens: list[dict[str, Any]],
    client_core: str,
) -> list[dict[str, Any]]:
    rows = []
    keys = (
        "rps",
        "p50_ms",
        "p90_ms",
        "p99_ms",
        "ttft_p50_ms",
        "ttft_p99_ms",
        "proxy_cpu_pct",
        "cpu_us_per_req",
        "rss_mb",
        "upstream_connections",
        "upstream_requests",
    )
    for sc in scens:
        cell: dict[str, dict[str, Any]] = {}
        for t in targets:
            rs = [r for r in results if r["target"] == t and r["scenario"] == sc["id"] and "rps" in r]
            if rs:
                cell[t] = {k: median(rs, k) for k in keys} | {
                    "errors": sum(r["errors"] for r in rs),
                    "runs": len(rs),
                    "target": t,
                    "scenario": sc["id"],
                    "others_pct": median([r["cpu_pct"] for r in rs], "others"),
                    "client_core_busy": median([r["cpu_pct"]["cores_busy"] for r in rs], client_core),
                }
                if (median(rs, "per_conn") or 0) < LITTLE_BELOW:  # few completions per connection: the window
                    cell[t]["rps_window"] = cell[t]["rps"]  # count is quantised; use Little's law c / mean latency
                    cell[t]["rps"], cell[t]["little"] = median(rs, "rps_little"), True
        for t, row in cell.items():
            for ref in ("direct", "thin", "litellm"):
                if ref in cell and ref != t and cell[ref]["rps"]:
                    row[f"x_{ref}"] = round(row["rps"] / cell[ref]["rps"], 3)
            if t != "direct" and "direct" in cell and row["p50_ms"] is not None:
                row["added_p50_ms"] = round(row["p50_ms"] - cell["direct"]["p50_ms"], 3)
            rows.append(row)
    return rows


def _pairs(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["target"], r["scenario"]): r for r in rows}


def _versus(rows: list[dict[str, Any]], prefix: str, base_prefix: str) -> list[dict[str, Any]]:
    """Each ``prefix`` cell against the ``base_prefix`` cell of the same target and scenario, same run."""
    by = _pairs(rows)
    out = []
    for r in rows:
        base = by.get((r["target"], base_prefix + r["scenario"].removeprefix(prefix)))
        if not r["scenario"].startswith(prefix) or base is None or not base["rps"]:
            continue
        cpu, cpu0 = r.get("cpu_us_per_req"), base.get("cpu_us_per_req")
        out.append(
            {
                "target": r["target"],
                "scenario": r["scenario"],
                "this_rps": r["rps"],
                "rps": base["rps"],
                "x_rps": round(r["rps"] / base["rps"], 3),
                "this_cpu_us": cpu,
                "cpu_us": cpu0,
                "x_cpu": round(cpu / cpu0, 3) if cpu and cpu0 else None,
            }
        )
    return out


def chat_vs_completions(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each chat cell against the completions cell of the same target in the same run.

    ``x_rps`` is chat/completions throughput (>= 0.9 is the target: chat costs no more per
    request); ``x_cpu`` is chat/completions proxy CPU per request (lower is better).
    """
    return _versus(rows, "chat_", "")


def responses_vs_chat(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each Responses cell against the chat cell of the same target in the same run.

    ``x_cpu`` is Responses/chat proxy CPU per request (the target: at most 1.15); ``x_rps`` throughput.
    """
    return _versus(rows, "resp_", "chat_")


def workers_vs_one(rows: list[dict[str, Any]], prefix: str = "gateway-w") -> list[dict[str, Any]]:
    """Each ``gateway-wN`` cell (or other ``prefix``: ``gateway-trace`` for tracing on) against ``gateway``
    (one process, tracing off) in the same run and scenario.

    ``x_rps``: throughput vs ``gateway``; ``x_cpu``: CPU per upstream request summed over every gateway
    process (control process and workers) vs ``gateway``'s.
    """
    by = _pairs(rows)
    out = []
    for r in rows:
        base = by.get(("gateway", r["scenario"]))
        if not r["target"].startswith(prefix) or base is None or not base["rps"]:
            continue
        cpu, cpu0 = r.get("cpu_us_per_req"), base.get("cpu_us_per_req")
        out.append(
            {
                "target": r["target"],
                "scenario": r["scenario"],
                "rps": r["rps"],
                "rps_1": base["rps"],
                "x_rps": round(r["rps"] / base["rps"], 3),
                "cpu_us": cpu,
                "cpu_us_1": cpu0,
                "x_cpu": round(cpu / cpu0, 3) if cpu and cpu0 else None,
            }
        )
    return out


def comparisons(rows: list[dict[str, Any]]) -> str:
    """The chat/completions and N-workers/one-worker tables (empty when the run has neither)."""
    out = []
    chat = chat_vs_completions(rows)
    if chat:
        out += [
            "",
            "| chat vs completions (same run) | target | chat req/s | completions req/s | x rps (>= 0.9) "
            "| chat CPU us/req | completions CPU us/req | x CPU |",
            "|---|---|---|---|---|---|---|---|",
        ]
        out += [
            f"| {c['scenario']} | {c['target']} | {fmt(c['this_rps'])} | {fmt(c['rps'])} | {ratio(c['x_rps'])} | "
            f"{fmt(c['this_cpu_us'], 0)} | {fmt(c['cpu_us'], 0)} | "
            f"{ratio(c['x_cpu']) if c['x_cpu'] is not None else '-'} |"
            for c in chat
        ]
    resp = responses_vs_chat(rows)
    if resp:
        out += [
            "",
            "| responses vs chat (same run) | target | responses req/s | chat req/s | x rps "
            "| responses CPU us/req | chat CPU us/req | x CPU (<= 1.15) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        out += [
            f"| {c['scenario']} | {c['target']} | {fmt(c['this_rps'])} | {fmt(c['rps'])} | {ratio(c['x_rps'])} | "
            f"{fmt(c['this_cpu_us'], 0)} | {fmt(c['cpu_us'], 0)} | "
            f"{ratio(c['x_cpu']) if c['x_cpu'] is not None else '-'} |"
            for c in resp
        ]
    workers = workers_vs_one(rows)
    if workers:
        out += [
            "",
            "| workers vs one process (same run) | target | req/s | req/s N=1 | x rps | CPU us/req (all "
            "processes) | CPU us/req N=1 | x CPU |",
            "|---|---|---|---|---|---|---|---|",
        ]
        out += [
            f"| {w['scenario']} | {w['target']} | {fmt(w['rps'])} | {fmt(w['rps_1'])} | {ratio(w['x_rps'])} | "
            f"{fmt(w['cpu_us'], 0)} | {fmt(w['cpu_us_1'], 0)} | "
            f"{ratio(w['x_cpu']) if w['x_cpu'] is not None else '-'} |"
            for w in workers
        ]
    traced = workers_vs_one(rows, "gateway-trace")
    if traced:
        out += [
            "",
            "| tracing on vs off (same run) | target (sampled %) | req/s | req/s off | x rps | CPU us/req "
            "| CPU us/req off | x CPU |",
            "|---|---|---|---|---|---|---|---|",
        ]
        out += [
            f"| {w['scenario']} | {w['target']} | {fmt(w['rps'])} | {fmt(w['rps_1'])} | {ratio(w['x_rps'])} | "
            f"{fmt(w['cpu_us'], 0)} | {fmt(w['cpu_us_1'], 0)} | "
            f"{ratio(w['x_cpu']) if w['x_cpu'] is not None else '-'} |"
            for w in traced
        ]
    return "\n".join(out)


def table(rows: list[dict[str, Any]], info: dict[str, Any], mem: list[dict[str, Any]]) -> str:
    refs = [r for r in ("direct", "thin", "litellm") if any(row.get(f"x_{r}") for row in rows)]
    head = [
        "scenario",
        "target",
        "req/s",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "TTFT p50",
        "err",
        *[f"x {r}" for r in refs],
        "+p50 ms",
        "proxy CPU %",
        "CPU us/req",
        "RSS MB",
        "upstream conns/reqs",
    ]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        ratios = [ratio(r[f"x_{ref}"]) if r.get(f"x_{ref}") is not None else "-" for ref in refs]
        cells = [
            r["scenario"],
            r["target"],
            fmt(r["rps"]) + (" †" if r.get("little") else ""),
            fmt(r["p50_ms"]),
            fmt(r["p90_ms"]),
            fmt(r["p99_ms"]),
            fmt(r["ttft_p50_ms"]),
            str(r["errors"]),
            *ratios,
            fmt(r.get("added_p50_ms")),
            fmt(r["proxy_cpu_pct"], 0),
            fmt(r["cpu_us_per_req"], 0),
            fmt(r["rss_mb"], 1),
            f"{fmt(r['upstream_connections'])}/{fmt(r['upstream_requests'])}",
        ]
        out.append("| " + " | ".join(cells) + " |")
    out += [
        "",
        "| target | start-up s (spawn to /health 200) | RSS at start MB | RSS at end MB | peak RSS MB | check |",
        "|---|---|---|---|---|---|",
    ]
    for name, i in info.items():
        ok = "error: " + i["error"] if "error" in i else ", ".join(f"{k}={v}" for k, v in i.get("check", {}).items())
        out.append(
            f"| {name} | {fmt(i.get('startup_s'), 3)} | {fmt(i.get('rss_start_mb'), 1)} | "
            f"{fmt(i.get('rss_mb'), 1)} | {fmt(i.get('hwm_mb'), 1)} | {ok} |"
        )
    notes = []
    for r in rows:
        if (r["others_pct"] or 0) > 10:
            notes.append(
                f"- warning: {r['target']}/{r['scenario']}: other processes used {r['others_pct']:.0f}% "
                "of a core during the cell (noisy machine)"
            )
        if r["target"] != "direct" and (r["client_core_busy"] or 0) > 95:
            notes.append(
                f"- note: {r['target']}/{r['scenario']}: the client+upstream core was "
                f"{r['client_core_busy']:.0f}% busy, so the client side may have been the limit"
            )
    if any(r.get("little") for r in rows):
        notes.append(
            f"- †: under {LITTLE_BELOW} completions per connection in the window, so req/s is Little's law "
            "(connections / mean latency); the window count is rps_window in the JSON"
        )
    extra = comparisons(rows)
    out += extra.split("\n") if extra else []
    out += ["", *notes] if notes else []
    if mem:
        out += [
            "",
            "| mem_streams target | open streams | RSS idle MB | peak RSS MB | KB/stream | streams/s | "
            "upstream conns (max open) | err |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for m in mem:
            out.append(
                f"| {m['target']} | {m['streams']} | {fmt(m.get('rss_idle_mb'), 1)} | "
                f"{fmt(m.get('peak_rss_mb'), 1)} | {fmt(m.get('kb_per_stream'), 1)} | {fmt(m.get('rps'))} | "
                f"{fmt(m.get('upstream_open_max'))} | {m.get('errors', m.get('error', '-'))} |"
            )
    return "\n".join(out).rstrip()
