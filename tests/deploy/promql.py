"""The PromQL in deploy/: the dashboard's queries, the alert rules' expressions, and the
metric names they select."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import yaml

from tests.deploy.conftest import DEPLOY

__all__ = [
    "ALERTS",
    "DASHBOARD",
    "dashboard",
    "dashboard_queries",
    "instantiate",
    "panels",
    "promql_metric_names",
    "rule_expressions",
]

DASHBOARD = DEPLOY / "grafana" / "dashboards" / "completions-gateway.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w:$.])([A-Za-z_:][\w:]*)(?![\w:])(\s*\()?")
_KEYWORDS = frozenset("and or unless offset bool inf nan by without on ignoring group_left group_right".split())


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not functions, labels or keywords)."""
    expr = _STRING.sub('""', expr)
    expr = _MATCHERS.sub("", expr)
    expr = _RANGE.sub("", expr)
    expr = _GROUPING.sub("", expr)
    return {m.group(1) for m in _IDENT.finditer(expr) if not m.group(2) and m.group(1) not in _KEYWORDS}


def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' nested panels included."""
    for panel in items:
        yield panel
        yield from panels(panel.get("panels", []))


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return data


def dashboard_queries() -> Iterator[tuple[str, str]]:
    """(panel or variable title, PromQL) for every query the dashboard sends to Prometheus."""
    board = dashboard()
    for panel in panels(board["panels"]):
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]
    for var in board["templating"]["list"]:
        if var["type"] != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        match = re.fullmatch(r"\s*label_values\((.+),\s*\w+\)\s*", query)
        assert match, f"variable {var['name']}: unexpected query {query!r}"
        yield f"variable {var['name']}", match.group(1)


def rule_expressions() -> Iterator[tuple[str, str]]:
    for group in yaml.safe_load(ALERTS.read_text(encoding="utf-8"))["groups"]:
        for rule in group["rules"]:
            yield rule.get("alert") or rule["record"], rule["expr"]


def instantiate(expr: str) -> str:
    """A dashboard query as Grafana sends it: its variables filled in."""
    for name, value in (("__rate_interval", "1m"), ("__interval", "1m"), ("__range", "1h")):
        expr = expr.replace(f"${{{name}}}", value).replace(f"${name}", value)
    return re.sub(r"\$\{?(model|backend)\}?", ".*", expr)
