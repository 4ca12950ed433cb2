"""deploy/helm/completions-gateway, the optional parts: the Redis that per-key limits need across
processes, the vLLM servers of the release, the Prometheus Operator objects; and the chart
and the Kustomize manifests saying the same thing about the gateway pod.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from gateway.configfile import parse_config
from schemas.config import GatewayConfig
from tests.deploy.conftest import DEPLOY
from tests.deploy.helm import (
    CHART,
    NAMESPACE,
    REDIS_URL,
    RELEASE,
    VARIANTS,
    Obj,
    config_text,
    container,
    gateway_deployment,
    one,
    pod_env,
    refusal,
    render,
    workers_per_pod,
)

FULLNAME = f"{RELEASE}-completions-gateway"


def _config(objs: tuple[Obj, ...]) -> GatewayConfig:
    text = config_text(objs)
    assert text is not None
    return parse_config(text, "configmap/gateway.yaml", pod_env(objs, container(gateway_deployment(objs), "gateway")))


def _max_processes(objs: tuple[Obj, ...]) -> int:
    hpas = [o for o in objs if o["kind"] == "HorizontalPodAutoscaler"]
    replicas = hpas[0]["spec"]["maxReplicas"] if hpas else gateway_deployment(objs)["spec"]["replicas"]
    return int(replicas) * workers_per_pod(objs)


def _limited(config: GatewayConfig) -> list[str]:
    keys = config.auth.keys if config.auth is not None else []
    return [k.name for k in keys if (k.rpm, k.tpm, k.max_concurrent) != (None, None, None)]


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "existing-config"])
def test_limits_hold_across_every_process(variant: str) -> None:
    """A limited key with more than one process counts in a Redis the pods can reach."""
    objs = render(variant)
    config = _config(objs)
    if not (_limited(config) and _max_processes(objs) > 1):
        return
    assert config.auth is not None
    url = config.auth.store_url
    assert url is not None, f"{variant}: keys {_limited(config)} are limited per process"
    gateway = container(gateway_deployment(objs), "gateway")
    source = next(e for e in gateway["env"] if e["name"] == REDIS_URL)
    if "valueFrom" in source:  # an external Redis, from a Secret
        assert "secretKeyRef" in source["valueFrom"]
        return
    # The release's Redis: a rendered Service on that port, before a pod with a readiness probe,
    # which the NetworkPolicy lets the gateway pods reach.
    where = urlsplit(url)
    assert where.hostname == f"{RELEASE}-completions-gateway-redis.{NAMESPACE}.svc.cluster.local"
    service = one(objs, "Service", f"{FULLNAME}-redis")
    assert [p["port"] for p in service["spec"]["ports"]] == [where.port]
    redis = one(objs, "Deployment", f"{FULLNAME}-redis")
    assert service["spec"]["selector"].items() <= redis["spec"]["template"]["metadata"]["labels"].items()
    assert container(redis, "redis")["readinessProbe"]["exec"]["command"] == ["redis-cli", "ping"]
    policy = one(objs, "NetworkPolicy", f"{FULLNAME}-redis")
    gateway_labels = gateway_deployment(objs)["spec"]["template"]["metadata"]["labels"]
    admitted = policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    assert admitted.items() <= gateway_labels.items()
    redis_pod = redis["spec"]["template"]["spec"]
    assert redis_pod["securityContext"]["runAsNonRoot"] is True
    assert container(redis, "redis")["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_chart_refuses_limits_that_would_not_hold(tmp_path: Path) -> None:
    values = yaml.safe_load((CHART / "examples" / "with-redis.yaml").read_text(encoding="utf-8"))
    values["redis"] = {"enabled": False}
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values), encoding="utf-8")
    error = refusal("-f", str(path))
    assert "keys team-a, team-b" in error and "16 gateway processes" in error
    # One process: the in-memory store is exact, and the chart lets it be.
    assert render("default", "-f", str(path), "--set", "autoscaling.enabled=false", "--set", "workers=1")


def test_an_external_redis_url_with_a_password_is_refused() -> None:
    error = refusal("--set", "redis.external.url=redis://:secret@redis:6379/0")
    assert "redis.external.existingSecret" in error


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "existing-config"])
def test_stored_conversations_are_shared_by_every_process(variant: str) -> None:
    """Several processes keep Responses' conversations in the Redis they are given (the one the
    limits use): never each in its own memory (400 store_not_shared, or a 404 on another pod)."""
    objs = render(variant)
    config = _config(objs)
    env = pod_env(objs, container(gateway_deployment(objs), "gateway"))
    if REDIS_URL in env:
        assert config.responses.store_url == env[REDIS_URL]
        assert config.auth is None or config.auth.store_url == env[REDIS_URL]
    else:
        assert config.responses.store_url is None
        assert _max_processes(objs) == 1, f"{variant}: {_max_processes(objs)} processes, each its own conversations"


def test_the_chart_shares_the_store_or_refuses(tmp_path: Path) -> None:
    """Workers > 1 and no Redis: refused, naming what the gateway would answer; Redis (the release's
    or an external one) fills responses.store in; a store the config names is kept."""
    error = refusal("--set", "workers=2")
    assert "2 gateway processes" in error and "store_not_shared" in error and "responses.store: memory" in error
    assert "store_not_shared" in refusal("--set", "autoscaling.enabled=true")  # replicas too: up to 6
    chosen = _config(render("default", "--set", "workers=2", "--set", "config.responses.store=memory"))
    assert chosen.responses.store_url is None  # the operator's explicit choice
    for redis in (["--set", "redis.enabled=true"], ["--set", "redis.external.url=redis://cache:6379/2"]):
        objs = render("default", "--set", "workers=2", *redis)
        assert (
            _config(objs).responses.store_url
            == pod_env(objs, container(gateway_deployment(objs), "gateway"))[REDIS_URL]
        )
    values = {"redis": {"enabled": True}, "workers": 2, "config": {"responses": {"store": "${OTHER}", "ttl": 600}}}
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values), encoding="utf-8")
    kept = yaml.safe_load(config_text(render("default", "-f", str(path))) or "")
    assert kept["responses"] == {"store": "${OTHER}", "ttl": 600}
    error = refusal("--set", "config.responses.store=redis://:pw@r:6379/0")
    assert "config.responses.store holds a password" in error


# --- vLLM servers of the release ------------------------------------------------------------


@pytest.mark.parametrize("variant", ["remote-vllm", "multi-node"])
def test_vllm_pods_and_the_gateway_config_agree(variant: str) -> None:
    objs = render(variant)
    sts = one(objs, "StatefulSet", f"{FULLNAME}-vllm")
    vllm = container(sts, "vllm")
    gpus = vllm["resources"]["limits"]["nvidia.com/gpu"]
    assert gpus >= 1 and vllm["resources"]["requests"]["nvidia.com/gpu"] == gpus
    assert f"--tensor-parallel-size={gpus}" in vllm["args"], "tensor parallelism uses exactly the GPUs requested"
    port = next(p["containerPort"] for p in vllm["ports"] if p["name"] == "http")
    assert f"--port={port}" in vllm["args"]
    assert vllm["readinessProbe"]["httpGet"]["path"] == "/health"
    if sts["spec"]["replicas"] > 1:
        terms = sts["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        assert [t["topologyKey"] for t in terms] == ["kubernetes.io/hostname"]

    headless = one(objs, "Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()

    # The gateway discovers the pods from that Service, with the key and model name vLLM has.
    config = _config(objs)
    (backend,) = config.backends
    assert backend.type == "vllm" and backend.discovery is not None
    assert backend.discovery.dns == f"{headless['metadata']['name']}.{NAMESPACE}.svc.cluster.local"
    assert backend.discovery.port == port
    gateway_env = {e["name"]: e for e in container(gateway_deployment(objs), "gateway")["env"]}
    vllm_env = {e["name"]: e for e in vllm["env"]}
    assert gateway_env["VLLM_API_KEY"]["valueFrom"] == vllm_env["VLLM_API_KEY"]["valueFrom"]
    assert gateway_env["SERVED_MODEL_NAME"]["value"] == vllm_env["SERVED_MODEL_NAME"]["value"]
    assert [m.name for m in config.models] == [vllm_env["SERVED_MODEL_NAME"]["value"]]


# --- Prometheus Operator ----------------------------------------------------------------------


@pytest.mark.parametrize("with_vllm", [False, True])
def test_monitoring(with_vllm: bool) -> None:
    objs = render("monitoring", *(["--set", "vllm.enabled=true"] if with_vllm else []))
    services = [o for o in objs if o["kind"] == "Service"]
    jobs = set()
    for monitor in (o for o in objs if o["kind"] == "ServiceMonitor"):
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        spec = monitor["spec"]
        selected = [s for s in services if spec["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
        assert len(selected) == 1, f"ServiceMonitor {monitor['metadata']['name']} selects {len(selected)} Services"
        assert {e["port"] for e in spec["endpoints"]} <= {p["name"] for p in selected[0]["spec"]["ports"]}
        assert all(e["path"] == "/metrics" for e in spec["endpoints"])
        jobs.add(selected[0]["metadata"]["labels"][spec["jobLabel"]])
    # The alerts and the dashboard select job="gateway" (and the vLLM servers as job="vllm").
    assert jobs == ({"gateway", "vllm"} if with_vllm else {"gateway"})
    rule = one(objs, "PrometheusRule")
    shipped = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text(encoding="utf-8"))
    assert rule["spec"]["groups"] == shipped["groups"]


def test_the_charts_alerts_are_deploy_prometheus_alerts() -> None:
    assert (CHART / "files" / "alerts.yml").read_bytes() == (DEPLOY / "prometheus" / "alerts.yml").read_bytes(), (
        "deploy/helm/completions-gateway/files/alerts.yml drifted: copy deploy/prometheus/alerts.yml over it"
    )


# --- the chart and the Kustomize manifests say the same thing -------------------------------


def _pod_contract(deployment: Obj) -> dict[str, Any]:
    """What the chart and the Kustomize base must agree on about the gateway pod."""
    pod = deployment["spec"]["template"]["spec"]
    gateway = container(deployment, "gateway")
    security = {k: v for k, v in pod["securityContext"].items() if k != "fsGroup"}
    probes = {name: {k: v for k, v in gateway[name].items()} for name in ("readinessProbe", "livenessProbe")}
    return {
        "pod security": security,
        "container security": gateway["securityContext"],
        "probes": probes,
        "preStop": gateway["lifecycle"]["preStop"],
        "grace": pod["terminationGracePeriodSeconds"],
        "resources": gateway["resources"],
        "args": gateway["args"],
        "workers": next(e for e in gateway["env"] if e["name"] == "GATEWAY_WORKERS")["valueFrom"],
        "config mount": next(m for m in gateway["volumeMounts"] if m["name"] == "config"),
        "automount token": pod["automountServiceAccountToken"],
        "strategy": deployment["spec"]["strategy"],
    }


def test_chart_and_kustomize_describe_the_same_gateway_pod() -> None:
    from tests.deploy.test_deploy_k8s import _one as kustomize_one
    from tests.deploy.test_deploy_k8s import _render as kustomize_render

    kustomize = _pod_contract(kustomize_one(kustomize_render("single-node"), "Deployment", "gateway"))
    chart = _pod_contract(gateway_deployment(render("remote-vllm")))
    different = {k: (kustomize[k], chart[k]) for k in kustomize if kustomize[k] != chart[k]}
    assert not different, f"deploy/k8s and the chart disagree (kustomize, chart): {different}"


def test_chart_and_kustomize_run_the_same_redis_and_vllm() -> None:
    from tests.deploy.test_deploy_k8s import _one as kustomize_one
    from tests.deploy.test_deploy_k8s import _render as kustomize_render

    kustomize_redis = container(kustomize_one(kustomize_render("multi-node"), "Deployment", "redis"), "redis")
    chart_redis = container(one(render("multi-node"), "Deployment", f"{FULLNAME}-redis"), "redis")
    for field in ("image", "args", "ports", "readinessProbe", "livenessProbe", "resources", "securityContext"):
        assert kustomize_redis[field] == chart_redis.get(field), f"Redis {field}: deploy/k8s and the chart disagree"

    kustomize_vllm = container(kustomize_one(kustomize_render("multi-node"), "StatefulSet"), "vllm")
    chart_vllm = container(one(render("multi-node"), "StatefulSet", f"{FULLNAME}-vllm"), "vllm")
    for field in ("image", "command", "ports", "startupProbe", "readinessProbe", "livenessProbe", "resources"):
        assert kustomize_vllm[field] == chart_vllm.get(field), f"vLLM {field}: deploy/k8s and the chart disagree"
    assert sorted(kustomize_vllm["args"]) == sorted(chart_vllm["args"])
    assert [m["mountPath"] for m in kustomize_vllm["volumeMounts"]] == [
        m["mountPath"] for m in chart_vllm["volumeMounts"]
    ]
