"""deploy/k8s: per-key limits and Responses' stored conversations hold for the whole gateway.
Wherever more than one gateway process can serve (HPA replicas x workers per pod), the
overlay's gateway YAML (validated by the gateway's own config model) names a Redis
``responses.store``, and ``auth.store`` too when a key has rpm/tpm/max_concurrent; each store
is a rendered Service on the right port in front of a Redis pod with a readiness probe,
reachable by the gateway pods through the NetworkPolicy.
"""

from __future__ import annotations

import copy
import math
from urllib.parse import urlsplit

import pytest
from pydantic import SecretStr

from gateway.configfile import parse_config
from schemas.config import GatewayConfig
from schemas.config.workers import worker_problems
from tests.deploy.test_deploy_k8s import (
    OVERLAYS,
    Obj,
    _container,
    _env_values,
    _gateway_config,
    _matches,
    _one,
    _render,
)

NAMESPACE = "completions-gateway"


def _config(objs: tuple[Obj, ...]) -> GatewayConfig:
    """The overlay's gateway YAML through the gateway's own parser, with the pod's environment."""
    env = _env_values(objs, _container(_one(objs, "Deployment", "gateway"), "gateway"))
    return parse_config(_gateway_config(objs)[1], "gateway-config/gateway.yaml", env)


def _workers_per_pod(objs: tuple[Obj, ...]) -> int:
    """GATEWAY_WORKERS as the Downward API sets it: requests.cpu / divisor, rounded up."""
    container = _container(_one(objs, "Deployment", "gateway"), "gateway")
    item = next(e for e in container["env"] if e["name"] == "GATEWAY_WORKERS")
    ref = item["valueFrom"]["resourceFieldRef"]
    assert ref["resource"] == "requests.cpu" and str(ref.get("divisor", "1")) == "1"
    cpu = str(container["resources"]["requests"]["cpu"])
    cores = int(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)
    return max(1, math.ceil(cores))


def _limited_keys(config: GatewayConfig) -> list[str]:
    if config.auth is None:
        return []
    return [k.name for k in config.auth.keys if (k.rpm, k.tpm, k.max_concurrent) != (None, None, None)]


def _store_problems(objs: tuple[Obj, ...], config: GatewayConfig) -> list[str]:
    """Why this overlay's limits or stored conversations would not hold gateway-wide (empty when they do)."""
    limited = _limited_keys(config)
    replicas = _one(objs, "HorizontalPodAutoscaler", "gateway")["spec"]["maxReplicas"]
    workers = _workers_per_pod(objs)
    problems = [f"{p} (--workers {workers})" for p in worker_problems(config, workers)]
    stores: dict[str, str] = {}
    url = config.auth.store_url if config.auth is not None else None
    if url is not None:
        stores["auth.store"] = url
    elif limited and replicas * workers > 1:
        problems.append(f"keys {limited} have limits and up to {replicas * workers} processes serve: no Redis store")
    if config.responses.store_url is not None:
        stores["responses.store"] = config.responses.store_url
    elif replicas * workers > 1:
        problems.append(f"up to {replicas * workers} processes serve: responses.store is each one's memory")
    for field, store in stores.items():
        problems += _redis_problems(objs, field, store)
    return problems


def _redis_problems(objs: tuple[Obj, ...], field: str, url: str) -> list[str]:
    """Why the Redis ``url`` (of ``field``) is not a Redis the gateway pods reach."""
    problems: list[str] = []
    where = urlsplit(url)
    host, port = where.hostname or "", where.port or 6379
    name = host.split(".", 1)[0]
    if host not in (name, f"{name}.{NAMESPACE}", f"{name}.{NAMESPACE}.svc", f"{name}.{NAMESPACE}.svc.cluster.local"):
        return [f"{field} host {host!r} is not a Service of namespace {NAMESPACE}"]
    services = [o for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == name]
    if not services:
        return [f"{field} names Service {name!r}, which the overlay does not render"]
    service = services[0]
    service_port = next((p for p in service["spec"]["ports"] if p["port"] == port), None)
    if service_port is None:
        return [f"Service {name} has no port {port} ({field}'s)"]
    pods = [
        o
        for o in objs
        if o["kind"] in ("Deployment", "StatefulSet")
        and _matches(service["spec"]["selector"], o["spec"]["template"]["metadata"]["labels"])
    ]
    if len(pods) != 1:
        return [*problems, f"Service {name} selects {len(pods)} workloads, not one Redis"]
    redis = pods[0]["spec"]["template"]["spec"]["containers"][0]
    target = service_port["targetPort"]
    container_port = next((p for p in redis["ports"] if target in (p["name"], p["containerPort"])), None)
    if container_port is None or container_port["containerPort"] != 6379:
        problems.append(f"Service {name} targets {target!r}, not Redis's port 6379")
    if "readinessProbe" not in redis:
        problems.append(f"{pods[0]['metadata']['name']} has no readiness probe")
    gateway_labels = _one(objs, "Deployment", "gateway")["spec"]["template"]["metadata"]["labels"]
    redis_labels = pods[0]["spec"]["template"]["metadata"]["labels"]
    for policy in (o for o in objs if o["kind"] == "NetworkPolicy"):
        if not _matches(policy["spec"]["podSelector"]["matchLabels"], redis_labels):
            continue
        admitted = [
            port
            for rule in policy["spec"].get("ingress", [])
            if any(_matches(src.get("podSelector", {}).get("matchLabels", {}), gateway_labels) for src in rule["from"])
            for port in rule.get("ports", [])
        ]
        if not any(p["port"] in (container_port or {}).values() for p in admitted):
            problems.append(f"NetworkPolicy {policy['metadata']['name']} does not admit the gateway to Redis")
    return problems


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_key_limits_hold_for_the_whole_gateway(overlay: str) -> None:
    objs = _render(overlay)
    assert _store_problems(objs, _config(objs)) == []


def test_multi_node_counts_limits_in_its_redis() -> None:
    """Not vacuous: the multi-node overlay limits its key and so ships the Redis it needs."""
    objs = _render("multi-node")
    config = _config(objs)
    assert _limited_keys(config) == ["default"]
    assert config.auth is not None and config.auth.store_url is not None
    assert urlsplit(config.auth.store_url).hostname == f"redis.{NAMESPACE}.svc.cluster.local"
    redis = _one(objs, "Deployment", "redis")
    assert redis["spec"]["replicas"] == 1
    assert _container(redis, "redis")["readinessProbe"]["exec"]["command"] == ["redis-cli", "ping"]
    # More workers per pod (a bigger requests.cpu) stay servable: the store is already shared.
    assert worker_problems(config, 4) == []


def test_single_node_keeps_its_conversations_in_redis() -> None:
    """No key is limited, but two replicas continue the same conversations: the store is Redis."""
    objs = _render("single-node")
    config = _config(objs)
    assert _limited_keys(config) == []
    assert config.responses.store_url == f"redis://redis.{NAMESPACE}.svc.cluster.local:6379/0"
    assert _one(objs, "Deployment", "redis")["spec"]["replicas"] == 1
    memory = config.model_copy(update={"responses": config.responses.model_copy(update={"store": SecretStr("memory")})})
    assert any("responses.store is each one's memory" in p for p in _store_problems(objs, memory))


def test_store_check_catches_a_mismatch() -> None:
    """The check is live: a wrong port, a Service that is not there, limits without a store."""
    objs = _render("multi-node")
    config = _config(objs)
    assert config.auth is not None
    wrong_port = config.model_copy(
        update={
            "auth": config.auth.model_copy(
                update={"store": SecretStr(f"redis://redis.{NAMESPACE}.svc.cluster.local:6380/0")}
            )
        }
    )
    assert any("no port 6380" in p for p in _store_problems(objs, wrong_port))
    no_service = tuple(o for o in objs if not (o["kind"] == "Service" and o["metadata"]["name"] == "redis"))
    assert any("does not render" in p for p in _store_problems(no_service, config))
    memory = config.model_copy(update={"auth": config.auth.model_copy(update={"store": SecretStr("memory")})})
    assert any("no Redis store" in p for p in _store_problems(objs, memory))
    unready = copy.deepcopy(objs)
    del _container(_one(unready, "Deployment", "redis"), "redis")["readinessProbe"]
    assert any("no readiness probe" in p for p in _store_problems(unready, config))
