"""deploy/helm/completions-gateway: ``helm lint`` passes and ``helm template`` renders for the
chart's defaults and every values file in its ``examples/``; every object passes
``kubernetes-validate``; the gateway gets a config that ``gateway check-config`` accepts with
the pod's environment and worker count; no secret sits in a ConfigMap; the pods are non-root on
a read-only root, probed on /health and /ready, and drained within their grace period.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, SecretStr

from gateway.configfile import parse_config
from tests.deploy.conftest import DEPLOY, K8S_VERSIONS, ROOT, check_config, config_variables, validate_objects
from tests.deploy.helm import (
    CHART,
    EXAMPLES,
    NAMESPACE,
    RELEASE,
    VARIANTS,
    config_text,
    container,
    gateway_deployment,
    helm_version,
    one,
    pod_env,
    refusal,
    render,
    run_helm,
    values_args,
    workers_per_pod,
)

FULLNAME = f"{RELEASE}-completions-gateway"


def test_the_chart_ships_the_examples_the_docs_name() -> None:
    assert {"remote-vllm", "multi-node", "vllm-pool", "with-redis", "external-redis", "monitoring"} <= set(EXAMPLES)


def test_helm_is_the_pinned_release() -> None:
    done = run_helm("version", "--short")
    assert done.returncode == 0, done.stderr
    if not done.stdout.startswith(f"v{helm_version()}+"):
        pytest.skip(
            f"helm {done.stdout.strip()} on PATH, not the pinned {helm_version()} (deploy/helm/install-helm.sh)"
        )


@pytest.mark.parametrize("variant", VARIANTS)
def test_helm_4_lints_and_renders_the_same_objects(variant: str) -> None:
    """Helm 4 users get what the tests check with Helm 3: the same objects (whitespace aside)."""
    done = run_helm("lint", "--strict", str(CHART), *values_args(variant), major=4)
    assert done.returncode == 0, done.stdout + done.stderr
    assert render(variant, major=4) == render(variant)


@pytest.mark.parametrize("variant", VARIANTS)
def test_helm_lint(variant: str) -> None:
    done = run_helm("lint", "--strict", str(CHART), *values_args(variant))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout


@pytest.mark.parametrize("variant", VARIANTS)
def test_renders(variant: str) -> None:
    objs = render(variant)
    kinds = sorted(o["kind"] for o in objs)
    expected = ["Deployment", "Service"] + ([] if variant == "existing-config" else ["ConfigMap"])
    assert set(expected) <= set(kinds)
    assert {o["metadata"]["namespace"] for o in objs} == {NAMESPACE}
    assert "Secret" not in kinds, "the chart never holds a secret: it names Secrets made outside it"
    if variant == "default":
        # HPA, PDB, Redis, vLLM and Prometheus Operator objects are all off unless asked for.
        assert sorted(kinds) == ["ConfigMap", "Deployment", "Service"]


@pytest.mark.parametrize("k8s_version", K8S_VERSIONS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_kubernetes_validate_accepts_every_object(variant: str, k8s_version: str) -> None:
    assert validate_objects(render(variant), k8s_version, variant) >= 2


# --- the gateway's config -------------------------------------------------------------------


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "existing-config"])
def test_gateway_config_passes_check_config(variant: str, tmp_path: Path) -> None:
    objs = render(variant)
    gateway = container(gateway_deployment(objs), "gateway")
    text = config_text(objs)
    assert text is not None
    env = pod_env(objs, gateway)
    missing_vars = config_variables(text) - set(env)
    assert not missing_vars, f"the gateway pod does not set {missing_vars}"
    path = tmp_path / "gateway.yaml"
    path.write_text(text, encoding="utf-8")
    done = check_config(path, env, "--workers", str(workers_per_pod(objs)))
    assert done.returncode == 0, done.stderr
    assert "OK" in done.stdout


def _secret_values(model: Any, path: str = "") -> dict[str, str]:
    """Every SecretStr in a parsed config, by YAML path."""
    found: dict[str, str] = {}
    if isinstance(model, SecretStr):
        found[path] = model.get_secret_value()
    elif isinstance(model, BaseModel):
        for name in type(model).model_fields:
            found.update(_secret_values(getattr(model, name), f"{path}.{name}" if path else name))
    elif isinstance(model, dict):
        for key, value in model.items():
            found.update(_secret_values(value, f"{path}.{key}"))
    elif isinstance(model, list | tuple):
        for i, value in enumerate(model):
            found.update(_secret_values(value, f"{path}[{i}]"))
    return found


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "existing-config"])
def test_every_secret_of_the_config_comes_from_a_secret(variant: str) -> None:
    """Parsed twice with different Secret contents: each secret field must change with them.

    A field that stays the same is a literal in the ConfigMap (or a plain env value), except
    the in-memory store and a Redis URL without a password (the release's own Redis).
    """
    objs = render(variant)
    gateway = container(gateway_deployment(objs), "gateway")
    text = config_text(objs)
    assert text is not None
    first = _secret_values(parse_config(text, "cm", pod_env(objs, gateway, "one-{name}-{key}-0123456789abcdef")))
    second = _secret_values(parse_config(text, "cm", pod_env(objs, gateway, "two-{name}-{key}-0123456789abcdef")))
    for path, value in first.items():
        if value == second[path]:
            assert value == "memory" or (value.startswith("redis://") and "@" not in value), (
                f"{variant}: {path} is the same whatever the Secrets hold: a secret in the ConfigMap"
            )
    for cm in (o for o in objs if o["kind"] == "ConfigMap"):
        for data in cm.get("data", {}).values():
            assert "one-" not in data and "two-" not in data


def _values_file(tmp_path: Path, values: dict[str, Any]) -> str:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values), encoding="utf-8")
    return str(path)


_KEY_A = {"name": "a", "key": "${A}"}
_OPENAI = {"name": "o", "type": "openai"}


@pytest.mark.parametrize(
    ("field", "config"),
    [
        ("config.backends[0].api_key", {"backends": [{**_OPENAI, "api_key": "sk-live-123"}]}),
        ("config.backends[0].headers.x-token", {"backends": [{**_OPENAI, "headers": {"x-token": "t"}}]}),
        ("config.auth.keys[1].key", {"auth": {"keys": [_KEY_A, {"name": "b", "key": "literal"}]}}),
        ("config.auth.store holds a password", {"auth": {"keys": [_KEY_A], "store": "redis://:pw@r:6379/0"}}),
    ],
)
def test_the_chart_refuses_a_literal_secret(field: str, config: dict[str, Any], tmp_path: Path) -> None:
    config = {"backends": [], "models": [], **config}
    error = refusal("-f", _values_file(tmp_path, {"config": config}))
    assert field in error


# --- the gateway's pods ---------------------------------------------------------------------


def _dockerfile_uid() -> int:
    for line in (DEPLOY / "docker" / "Dockerfile").read_text(encoding="utf-8").splitlines():
        if line.startswith("USER "):
            return int(line.split()[1].split(":")[0])
    raise AssertionError("the gateway Dockerfile has no USER")


@pytest.mark.parametrize("variant", VARIANTS)
def test_gateway_pods_are_operable(variant: str) -> None:
    objs = render(variant)
    deployment = gateway_deployment(objs)
    pod = deployment["spec"]["template"]["spec"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    gateway = container(deployment, "gateway")
    args = gateway["args"]
    version = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    pool = variant == "vllm-pool"

    # The config file the CLI reads is the mounted one; it listens on the port probed and served.
    mount = next(m for m in gateway["volumeMounts"] if m["name"] == "config")
    assert Path(args[args.index("--config") + 1]) == Path(mount["mountPath"]) / "gateway.yaml"
    port = int(args[args.index("--port") + 1])
    assert {p["name"]: p["containerPort"] for p in gateway["ports"]} == {"http": port}
    assert gateway["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert gateway["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}

    # Termination outlasts preStop + the drain (+ the pool's stop); liveness never cuts it short.
    grace = pod["terminationGracePeriodSeconds"]
    assert gateway["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
    pre_stop = int(gateway["lifecycle"]["preStop"]["exec"]["command"][1])
    text = config_text(objs)
    if text is not None:
        server = (yaml.safe_load(text) or {}).get("server", {})
        drain = server.get("drain_timeout", 30) + server.get("drain_delay", 0)
        stop = max(
            [b.get("stop_timeout", 30) for b in yaml.safe_load(text)["backends"] if b["type"] == "vllm-pool"] or [0]
        )
        assert grace > pre_stop + drain + stop, (grace, pre_stop, drain, stop)
    liveness = gateway["livenessProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] > grace

    if pool:
        # The gateway on vLLM's image, with the pod's GPUs, shared memory and a model cache.
        assert gateway["image"] == f"completions-gateway-vllm:{version}"
        gpus = gateway["resources"]["limits"]["nvidia.com/gpu"]
        assert gpus >= 1 and gateway["resources"]["requests"]["nvidia.com/gpu"] == gpus
        assert {"/dev/shm", "/root/.cache/huggingface"} <= {m["mountPath"] for m in gateway["volumeMounts"]}
        assert any(t.get("key") == "nvidia.com/gpu" for t in pod["tolerations"])
        assert pod["nodeSelector"], "the vllm-pool example picks its GPU nodes"
        assert deployment["spec"]["strategy"]["type"] == "Recreate"
    else:
        # Non-root as the image's USER, on a read-only root, no privilege, no capabilities.
        assert gateway["image"] == f"completions-gateway:{version}"
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == _dockerfile_uid()
        assert gateway["securityContext"]["readOnlyRootFilesystem"] is True
        assert gateway["securityContext"]["allowPrivilegeEscalation"] is False
        assert gateway["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert "nvidia.com/gpu" not in str(gateway["resources"])
    assert pod["automountServiceAccountToken"] is False
    assert any(m["mountPath"] == "/tmp" for m in gateway["volumeMounts"])
    assert "cpu" in gateway["resources"]["requests"]

    # Service, PDB and HPA point at these pods; with the HPA, the Deployment leaves replicas to it.
    service = one(objs, "Service", FULLNAME)
    assert service["spec"]["selector"].items() <= labels.items()
    assert {p["targetPort"] for p in service["spec"]["ports"]} == {"http"}
    hpas = [o for o in objs if o["kind"] == "HorizontalPodAutoscaler"]
    for hpa in hpas:
        assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": FULLNAME}
        assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    assert ("replicas" in deployment["spec"]) == (not hpas)
    for pdb in (o for o in objs if o["kind"] == "PodDisruptionBudget"):
        assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_the_chart_version_is_the_gateways() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    version = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    assert chart["appVersion"] == version


_SHARED = ("--set", "redis.enabled=true")  # several processes keep conversations in Redis


def test_workers_follow_the_pods_cpu(tmp_path: Path) -> None:
    """requests: the Downward API's rounded-up request; auto: only with a CPU limit; N: N."""
    by_default = container(gateway_deployment(render("default")), "gateway")
    ref = next(e for e in by_default["env"] if e["name"] == "GATEWAY_WORKERS")["valueFrom"]["resourceFieldRef"]
    assert ref == {"containerName": "gateway", "resource": "requests.cpu", "divisor": "1"}
    error = refusal("--set", "workers=auto")
    assert "limits.cpu" in error and "a worker per core of the node" in error
    auto = container(
        gateway_deployment(render("default", "--set", "workers=auto", "--set", "resources.limits.cpu=3", *_SHARED)),
        "gateway",
    )
    assert next(e for e in auto["env"] if e["name"] == "GATEWAY_WORKERS")["value"] == "auto"
    assert "requests" in refusal("--set", "workers=many")


def test_existing_config_is_mounted_and_not_rendered() -> None:
    objs = render("existing-config")
    volumes = gateway_deployment(objs)["spec"]["template"]["spec"]["volumes"]
    assert next(v for v in volumes if v["name"] == "config") == {
        "name": "config",
        "configMap": {"name": "gateway-config"},
    }
    assert not [o for o in objs if o["kind"] == "ConfigMap"]
    secret = render("default", "--set", "existingConfigSecret=gateway-config")
    volumes = gateway_deployment(secret)["spec"]["template"]["spec"]["volumes"]
    assert next(v for v in volumes if v["name"] == "config")["secret"] == {"secretName": "gateway-config"}


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("replicacount=2", "'replicacount' not allowed"),
        ("vllm.imag.tag=v1", "'imag' not allowed"),
        ("workers=0", "/workers"),
        ("redis.external.url=localhost:6379", "/redis/external/url"),
        ("monitoring.serviceMonitor.interval=often", "/monitoring/serviceMonitor/interval"),
    ],
)
def test_values_schema_refuses_what_would_be_ignored_or_broken(setting: str, named: str) -> None:
    """values.schema.json: a misspelt key would otherwise be ignored without a word."""
    assert named in refusal("--set", setting)
