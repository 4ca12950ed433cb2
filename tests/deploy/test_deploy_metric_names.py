"""Every metric the Grafana dashboard and the alert rules name is exported by the gateway.

The names are extracted from the dashboard's queries and the rules' expressions and
compared with a live ``/metrics`` of the real gateway process, so a renamed or misspelt
metric fails here instead of leaving a blank panel or a silent alert. The only names
excused are on the commented allow-lists below.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import DEPLOY, exported_metric_names
from tests.deploy.promql import dashboard, dashboard_queries, panels, promql_metric_names, rule_expressions

# Series that other exporters produce: the gateway never will.
FROM_OTHER_EXPORTERS = {
    "up": "Prometheus itself, one series per scrape target",
    "vllm:kv_cache_usage_perc": "vLLM's own /metrics (vLLM >= 0.10; vllm:gpu_cache_usage_perc before)",
    "vllm:num_requests_waiting": "vLLM's own /metrics",
    "vllm:num_requests_running": "vLLM's own /metrics",
}

# Gateway metrics that a quickstart gateway (one mock backend, auth off, nothing failing)
# cannot show: labelled series appear only after their first event (a retry, a failover,
# a 429) or when their feature is configured (keys, a Redis store). They are excused from
# the live comparison, but each must still be declared in the gateway's code (checked in
# test_conditional_metrics_are_declared), so a rename still fails here.
CONDITIONAL = {
    "gateway_key_requests_total": "issue 9",
    "gateway_key_tokens_total": "issue 9",
    "gateway_key_rejections_total": "issue 9",
    "gateway_ratelimit_store_degraded": "issue 9",
    "gateway_ratelimit_store_errors_total": "issue 9",
    "gateway_retries_total": "issue 4",
    "gateway_failovers_total": "issue 4",
    "gateway_circuit_state": "issue 4",
    "gateway_circuit_opened_total": "issue 4",
    "gateway_no_healthy_route_total": "issue 4",
    "gateway_queue_depth": "issue 4",
    "gateway_queue_wait_seconds_bucket": "issue 4",
    "gateway_admission_rejections_total": "issue 4",
}

# Gateway metrics that exist only while a `vllm-pool` backend is configured (issue 6's
# pool collector): the quickstart gateway, with its one mock backend, cannot show them.
# TODO(issue 6): once the pool has landed, scrape a gateway running a pool of stand-in
# workers here and drop this list.
POOL_ONLY = {
    "gateway_pool_worker_state": "vllm-pool backends only",
    "gateway_pool_worker_restarts_total": "vllm-pool backends only",
    "gateway_pool_worker_kv_cache_usage": "vllm-pool backends only",
    "gateway_pool_worker_queue": "vllm-pool backends only",
    "gateway_pool_worker_in_flight": "vllm-pool backends only",
    "gateway_pool_routing_decisions_total": "vllm-pool backends only",
}


def test_promql_metric_names() -> None:
    expr = (
        'sum by (model, le) (rate(gateway_x_bucket{job="gateway", model=~"$model"}[$__rate_interval]))'
        " / on (model) group_left ignoring (le) vllm:y offset 5m and up == bool 0"
        ' or label_replace(z_total, "dst", "$1", "src", "(.*)")'
    )
    assert promql_metric_names(expr) == {"gateway_x_bucket", "vllm:y", "up", "z_total"}
    assert promql_metric_names("histogram_quantile(0.99, sum by (le) (rate(a_bucket[5m]))) > 1e3") == {"a_bucket"}


# --- the checks --------------------------------------------------------------------------


def _names_used() -> dict[str, set[str]]:
    used: dict[str, set[str]] = {}
    for source, queries in (("dashboard", dashboard_queries()), ("alerts", rule_expressions())):
        for title, expr in queries:
            names = promql_metric_names(expr)
            assert names, f"{source} {title!r}: no metric found in {expr!r}"
            for name in names:
                used.setdefault(name, set()).add(f"{source}: {title}")
    return used


def test_every_metric_used_is_exported(live_metrics: str) -> None:
    exported = exported_metric_names(live_metrics)
    assert "gateway_requests_total" in exported and "gateway_request_duration_seconds_bucket" in exported
    unknown = {
        name: sorted(where)
        for name, where in _names_used().items()
        if name not in exported and name not in FROM_OTHER_EXPORTERS | CONDITIONAL | POOL_ONLY
    }
    assert unknown == {}, "metrics used but not exported by the gateway (renamed? misspelt?)"


def test_conditional_metrics_are_declared() -> None:
    """Each excused name is the family a gateway module registers (suffixes as exported)."""
    from pathlib import Path

    source = "\n".join(p.read_text() for p in (Path(__file__).parents[2] / "gateway").rglob("*.py"))
    missing = []
    for name in CONDITIONAL:
        family = name.removesuffix("_bucket").removesuffix("_total")
        if f'"{family}"' not in source:
            missing.append(name)
    assert missing == [], "excused metrics that no gateway module declares (renamed?)"


def test_allow_lists_hold_only_names_in_use() -> None:
    used = set(_names_used())
    assert set(FROM_OTHER_EXPORTERS) - used == set()
    assert set(CONDITIONAL) - used == set()
    assert set(POOL_ONLY) - used == set()
    assert all(name.startswith("gateway_") for name in (*CONDITIONAL, *POOL_ONLY))
    assert all(name.startswith("gateway_pool_") for name in POOL_ONLY)


def test_dashboard_shows_the_gateway_metrics(live_metrics: str) -> None:
    """The request-path metrics are on the dashboard; any other exported one not shown warns."""
    on_dashboard = {n for _, expr in dashboard_queries() for n in promql_metric_names(expr)}
    exported = exported_metric_names(live_metrics)
    core = {
        "gateway_requests_total",
        "gateway_request_duration_seconds_bucket",
        "gateway_time_to_first_token_seconds_bucket",
        "gateway_prompt_tokens_total",
        "gateway_completion_tokens_total",
        "gateway_requests_in_flight",
        "gateway_unsupported_parameter_rejections_total",
        "gateway_upstream_errors_total",
        "gateway_stream_failures_total",
        "gateway_client_disconnects_total",
    }
    assert core <= exported
    assert core - on_dashboard == set()
    # A histogram counts as shown through its _bucket series.
    shown = on_dashboard | {n.removesuffix("_bucket") for n in on_dashboard}
    unshown = sorted(
        n
        for n in exported
        if n.startswith("gateway_") and not n.endswith(("_created", "_sum", "_count", "_bucket")) and n not in shown
    )
    if unshown:
        warnings.warn(f"exported but on no dashboard panel: {', '.join(unshown)}", UserWarning, stacklevel=1)


# --- the dashboard's shape ----------------------------------------------------------------


def test_dashboard_shape() -> None:
    board = dashboard()
    assert board["uid"] == "completions-gateway" and board["title"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    every = list(panels(board["panels"]))
    ids = [p["id"] for p in every]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: set[tuple[int, int]] = set()
    for panel in every:
        pos = panel["gridPos"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24, panel["title"]
        area = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not area & cells, f"panel {panel['title']!r} overlaps another"
        cells |= area
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]


@pytest.mark.parametrize("path", sorted((DEPLOY / "grafana" / "provisioning").rglob("*.yaml")), ids=lambda p: p.name)
def test_grafana_provisioning_files(path: Any) -> None:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert data["apiVersion"] == 1
    assert data.get("datasources") or data.get("providers")
    for source in data.get("datasources", []):
        assert source["type"] == "prometheus" and source["url"].startswith("http://")
    for provider in data.get("providers", []):
        assert provider["type"] == "file" and provider["options"]["path"].startswith("/")
