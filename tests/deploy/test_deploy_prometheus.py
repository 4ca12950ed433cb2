"""deploy/prometheus with the real tools: promtool checks the scrape config, the rules,
the rules' unit tests and the gateway's live /metrics; a real Prometheus server scrapes a
real gateway process with the shipped scrape config and answers PromQL about it.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import free_port
from tests.deploy.conftest import DEPLOY, QUICKSTART_MODEL, http_get, need, running_gateway, send_traffic
from tests.deploy.promql import dashboard_queries, instantiate

PROMETHEUS_DIR = DEPLOY / "prometheus"
SCRAPE_CONFIG = PROMETHEUS_DIR / "prometheus.yml"
ALERTS = PROMETHEUS_DIR / "alerts.yml"
ALERTS_TEST = PROMETHEUS_DIR / "alerts_test.yml"


def _promtool(*args: str, stdin: str | None = None, cwd: Path = PROMETHEUS_DIR) -> subprocess.CompletedProcess[str]:
    return subprocess.run([need("promtool"), *args], cwd=cwd, input=stdin, capture_output=True, text=True, timeout=120)


def test_promtool_check_config() -> None:
    done = _promtool("check", "config", SCRAPE_CONFIG.name)
    assert done.returncode == 0, done.stdout + done.stderr
    # It follows rule_files, so the rules are checked through the config too.
    assert "SUCCESS" in done.stdout and ALERTS.name in done.stdout


def test_promtool_check_rules() -> None:
    done = _promtool("check", "rules", ALERTS.name)
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_test_rules() -> None:
    done = _promtool("test", "rules", ALERTS_TEST.name)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_unit_test() -> None:
    alerts = {r["alert"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"] if "alert" in r}
    tests = yaml.safe_load(ALERTS_TEST.read_text())["tests"]
    tested = {case["alertname"] for t in tests for case in t.get("alert_rule_test", []) if case.get("exp_alerts")}
    assert alerts - tested == set(), "alerts never shown firing in alerts_test.yml"


def test_promtool_check_metrics_on_live_gateway(live_metrics: str) -> None:
    done = _promtool("check", "metrics", stdin=live_metrics)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "" and done.stderr.strip() == "", done.stdout + done.stderr


# --- a real Prometheus scraping a real gateway -----------------------------------------


def _adapted_config(gateway_port: int) -> dict[str, Any]:
    """The shipped scrape config with the gateway job pointed at the test gateway.

    Only what a test on loopback must change: the gateway target, 1 s intervals, the
    rule file by absolute path; jobs for targets that do not exist here (vLLM) are dropped.
    """
    config = yaml.safe_load(SCRAPE_CONFIG.read_text(encoding="utf-8"))
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    gateway = jobs["gateway"]
    assert [t for sc in gateway["static_configs"] for t in sc["targets"]] == ["gateway:8080"]
    gateway["static_configs"] = [{"targets": [f"127.0.0.1:{gateway_port}"]}]
    config["scrape_configs"] = [gateway]
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(PROMETHEUS_DIR / name) for name in config["rule_files"]]
    return config


def _api(base: str, path: str, **params: str) -> Any:
    status, body = http_get(f"{base}{path}?{urllib.parse.urlencode(params)}", timeout=10)
    answer = json.loads(body)
    assert status == 200 and answer["status"] == "success", (path, params, answer)
    return answer["data"]


def _wait_for(what: str, probe: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}; last answer: {last!r}")


def test_prometheus_scrapes_the_gateway(tmp_path: Path) -> None:
    prometheus = need("prometheus")
    with running_gateway() as gateway:
        produced = send_traffic(gateway)
        config_file = tmp_path / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(_adapted_config(gateway.port)), encoding="utf-8")
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        log = (tmp_path / "prometheus.log").open("wb")
        proc = subprocess.Popen(
            [
                prometheus,
                f"--config.file={config_file}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:

            def ready() -> bool:
                if proc.poll() is not None:
                    raise AssertionError((tmp_path / "prometheus.log").read_text())
                try:
                    return http_get(f"{base}/-/ready", timeout=1)[0] == 200
                except OSError:
                    return False

            _wait_for("Prometheus to be ready", ready)

            # The request counts the test produced, by status, as PromQL sees them.
            query = f'sum by (status) (gateway_requests_total{{job="gateway", model=~"{QUICKSTART_MODEL}|_unknown"}})'

            def counts() -> Counter[str] | None:
                result = _api(base, "/api/v1/query", query=query)["result"]
                seen = Counter({r["metric"]["status"]: int(float(r["value"][1])) for r in result})
                return seen if seen == produced else None

            _wait_for(f"Prometheus to report {dict(produced)}", counts)
            ok = _api(
                base, "/api/v1/query", query=f'sum(gateway_requests_total{{model="{QUICKSTART_MODEL}", status="200"}})'
            )
            assert int(float(ok["result"][0]["value"][1])) == produced["200"] == 7

            targets = _api(base, "/api/v1/targets")["activeTargets"]
            assert [(t["labels"]["job"], t["health"]) for t in targets] == [("gateway", "up")]

            # The alert rules load and evaluate cleanly against real data.
            def rules_evaluated() -> list[dict[str, Any]] | None:
                groups = _api(base, "/api/v1/rules")["groups"]
                rules = [r for g in groups for r in g["rules"]]
                # health is "unknown" until a rule's first evaluation, "err" if it failed.
                return rules if rules and all(r["health"] == "ok" for r in rules) else None

            rules = _wait_for("every alert rule to evaluate", rules_evaluated)
            shipped = [r["alert"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
            assert sorted(r["name"] for r in rules) == sorted(shipped)
            firing = {r["name"] for r in rules if r["state"] != "inactive"}
            assert firing == set(), f"alerts pending or firing on a healthy gateway: {firing}"

            # Prometheus parses every dashboard query (Grafana variables filled in).
            for title, expr in dashboard_queries():
                params = {"query": instantiate(expr)}
                status, body = http_get(f"{base}/api/v1/query?{urllib.parse.urlencode(params)}", timeout=10)
                assert status == 200, f"panel {title!r}: Prometheus refused {params['query']!r}: {body.decode()}"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
