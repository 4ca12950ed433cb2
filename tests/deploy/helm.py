"""Rendering deploy/helm/completions-gateway with the real ``helm`` binary, for the chart's tests.

The binary is the one ``deploy/helm/install-helm.sh`` caches under ``~/.cache/gateway-helm``
(``.ci/run`` runs it), else ``$GATEWAY_HELM``, else ``helm`` on PATH; without one the tests
skip, and fail under ``CI=true`` (:func:`tests.deploy.conftest.missing`).
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.conftest import DEPLOY, config_variables, missing

CHART = DEPLOY / "helm" / "completions-gateway"
INSTALLER = DEPLOY / "helm" / "install-helm.sh"
EXAMPLES = {p.stem: p for p in sorted((CHART / "examples").glob("*.yaml"))}
# "default" is the chart's own values.yaml; the others add one file of examples/.
VARIANTS = ["default", *EXAMPLES]
RELEASE = "gw"
NAMESPACE = "llm"

REDIS_URL = "GATEWAY_REDIS_URL"  # the variable the chart sets to the Redis it is given

Obj = dict[str, Any]


def helm_version(major: int = 3) -> str:
    """The release of helm ``major`` that deploy/helm/install-helm.sh pins."""
    match = re.search(rf'^HELM{major}_VERSION="([0-9.]+)"', INSTALLER.read_text(encoding="utf-8"), re.M)
    assert match, f"{INSTALLER} must pin HELM{major}_VERSION"
    return match.group(1)


@functools.cache
def helm(major: int = 3) -> str:
    """helm 3 (the one the tests render with): $GATEWAY_HELM, the cached pin, or helm on PATH.
    helm 4: $GATEWAY_HELM4 or the cached pin."""
    cached = str(Path.home() / ".cache" / "gateway-helm" / helm_version(major) / "helm")
    for candidate in (os.environ.get("GATEWAY_HELM" if major == 3 else "GATEWAY_HELM4", ""), cached):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    if major == 3:
        on_path = subprocess.run(["sh", "-c", "command -v helm"], capture_output=True, text=True)
        if on_path.returncode == 0:
            return on_path.stdout.strip()
    missing("helm" if major == 3 else "helm 4")
    raise AssertionError("unreachable")


def run_helm(*args: str, major: int = 3) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm(major), *args], capture_output=True, text=True, timeout=120)


def values_args(variant: str) -> list[str]:
    return [] if variant == "default" else ["-f", str(EXAMPLES[variant])]


def template(*args: str, major: int = 3) -> subprocess.CompletedProcess[str]:
    """``helm template`` of the chart as release ``gw`` in namespace ``llm``, with ``args`` added."""
    return run_helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args, major=major)


@functools.cache
def render(variant: str, *extra: str, major: int = 3) -> tuple[Obj, ...]:
    done = template(*values_args(variant), *extra, major=major)
    assert done.returncode == 0, f"helm template ({variant} {' '.join(extra)}) failed:\n{done.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def refusal(*args: str) -> str:
    """The error of a ``helm template`` that must fail."""
    done = template(*args)
    assert done.returncode != 0, f"helm template {' '.join(args)} rendered, but must refuse"
    return done.stderr


def one(objs: tuple[Obj, ...], kind: str, name: str | None = None) -> Obj:
    found = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def gateway_deployment(objs: tuple[Obj, ...]) -> Obj:
    return one(objs, "Deployment", f"{RELEASE}-completions-gateway")


def container(workload: Obj, name: str) -> Obj:
    return next(c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def pod_env(objs: tuple[Obj, ...], gateway: Obj, secret_value: str = "stand-in-{name}-{key}") -> dict[str, str]:
    """The gateway container's environment as the kubelet would set it.

    A Secret's value is ``secret_value`` formatted with the Secret's name and key; a whole
    Secret (``envFrom``) supplies every variable the config reads that nothing else sets.
    ``requests.cpu`` through the Downward API is the pod's request, rounded up.
    """
    env: dict[str, str] = {}
    for item in gateway.get("env", []):
        source = item.get("valueFrom", {})
        if "value" in item:
            env[item["name"]] = item["value"]
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            value = secret_value.format(name=ref["name"], key=ref["key"])
            # A Redis URL with its password, as redis.external.existingSecret holds it.
            env[item["name"]] = f"rediss://:{value}@redis.invalid:6380/0" if item["name"] == REDIS_URL else value
        elif "resourceFieldRef" in source:
            assert source["resourceFieldRef"]["resource"] == "requests.cpu"
            env[item["name"]] = str(cpus(gateway["resources"]["requests"]["cpu"]))
        else:
            raise AssertionError(f"unexpected env source {item}")
    for source in gateway.get("envFrom", []):
        secret = source["secretRef"]["name"]
        for name in config_variables(config_text(objs) or "") - set(env):
            env[name] = secret_value.format(name=secret, key=name)
    return env


def workers_per_pod(objs: tuple[Obj, ...]) -> int:
    """The worker processes each gateway pod starts (GATEWAY_WORKERS, ``auto`` read from the CPU limit)."""
    gateway = container(gateway_deployment(objs), "gateway")
    value = pod_env(objs, gateway)["GATEWAY_WORKERS"]
    return cpus(gateway["resources"]["limits"]["cpu"]) if value == "auto" else int(value)


def cpus(quantity: str | int | float) -> int:
    """A CPU quantity rounded up, as the Downward API reports it with divisor 1."""
    text = str(quantity)
    cores = int(text[:-1]) / 1000 if text.endswith("m") else float(text)
    return max(1, -int(-cores // 1))


def config_text(objs: tuple[Obj, ...]) -> str | None:
    """The gateway YAML the pods mount, when the release renders it (not an existing object)."""
    volumes = gateway_deployment(objs)["spec"]["template"]["spec"]["volumes"]
    source = next(v for v in volumes if v["name"] == "config")
    if "configMap" not in source:
        return None
    found = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == source["configMap"]["name"]]
    if not found:
        return None
    text: str = found[0]["data"]["gateway.yaml"]
    return text
