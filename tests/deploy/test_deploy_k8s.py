"""deploy/k8s: every overlay renders with ``kubectl kustomize``, every object passes
``kubernetes-validate``, the ConfigMap's gateway YAML passes ``gateway check-config``, and
the pieces agree with each other (probes, ports, selectors, grace periods, GPUs, pod names).
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import (
    CRD_KINDS,
    DEPLOY,
    K8S_VERSIONS,
    ROOT,
    check_config,
    config_variables,
    kubernetes_validate,
    need,
    validate_objects,
)

K8S = DEPLOY / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if (p / "kustomization.yaml").is_file())
MONITORING = K8S / "components" / "monitoring"
# An overlay alone, and with the optional Prometheus Operator component added.
VARIANTS = [*OVERLAYS, *(f"{o}+monitoring" for o in OVERLAYS)]

Obj = dict[str, Any]


def test_overlays_exist() -> None:
    assert {"single-node", "multi-node"} <= set(OVERLAYS)


@functools.cache
def _render(variant: str) -> tuple[Obj, ...]:
    kubectl = need("kubectl")
    overlay, _, component = variant.partition("+")
    with tempfile.TemporaryDirectory(prefix="gateway-kustomize-") as tmp:
        target = K8S / "overlays" / overlay
        if component:
            # A throwaway overlay on top: <overlay> + components/<component> (kustomize
            # wants the paths relative).
            target = Path(tmp)
            (target / "kustomization.yaml").write_text(
                yaml.safe_dump(
                    {
                        "apiVersion": "kustomize.config.k8s.io/v1beta1",
                        "kind": "Kustomization",
                        "resources": [os.path.relpath(K8S / "overlays" / overlay, target)],
                        "components": [os.path.relpath(K8S / "components" / component, target)],
                    }
                ),
                encoding="utf-8",
            )
        done = subprocess.run([kubectl, "kustomize", str(target)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"kubectl kustomize {variant} failed:\n{done.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def _one(objs: tuple[Obj, ...], kind: str, name: str | None = None) -> Obj:
    found = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def _container(workload: Obj, name: str) -> Obj:
    return next(c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def _gateway_config(objs: tuple[Obj, ...]) -> tuple[Obj, str]:
    """The ConfigMap mounted into the gateway pods, and its gateway YAML text."""
    deployment = _one(objs, "Deployment", "gateway")
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    cm_name = next(v["configMap"]["name"] for v in volumes if "configMap" in v)
    cm = _one(objs, "ConfigMap", cm_name)
    return cm, cm["data"]["gateway.yaml"]


def _env_values(objs: tuple[Obj, ...], container: Obj) -> dict[str, str]:
    """The container's environment as the kubelet would set it; Secret values are stand-ins."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        source = item.get("valueFrom", {})
        if "value" in item:
            env[item["name"]] = item["value"]
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            env[item["name"]] = _one(objs, "ConfigMap", ref["name"])["data"][ref["key"]]
        elif "secretKeyRef" in source:
            env[item["name"]] = f"stand-in-for-secret-{source['secretKeyRef']['key']}"
    return env


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


# --- rendering and schema validation ----------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_kustomize_renders(variant: str) -> None:
    objs = _render(variant)
    kinds = {o["kind"] for o in objs}
    expected = {
        "Namespace",
        "ConfigMap",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        "StatefulSet",
    }
    if variant.endswith("+monitoring"):
        expected |= CRD_KINDS
    expected |= {"NetworkPolicy"}  # components/redis (every overlay): only the gateway pods reach Redis
    assert kinds == expected
    namespaced = [o for o in objs if o["kind"] != "Namespace"]
    assert {o["metadata"].get("namespace") for o in namespaced} == {"completions-gateway"}


@pytest.mark.parametrize("k8s_version", K8S_VERSIONS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_kubernetes_validate_accepts_every_object(variant: str, k8s_version: str) -> None:
    assert validate_objects(_render(variant), k8s_version, variant) >= 9


def test_kubernetes_validate_rejects_a_broken_object() -> None:
    """The validator is live: a misspelt field and a wrong type are both refused."""
    kv = kubernetes_validate()
    deployment = _one(_render(OVERLAYS[0]), "Deployment", "gateway")
    typo = yaml.safe_load(yaml.safe_dump(deployment))
    container = typo["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kv.ValidationError):
        kv.validate(typo, K8S_VERSIONS[-1], strict=True)
    wrong_type = yaml.safe_load(yaml.safe_dump(deployment))
    wrong_type["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "forty-five"
    with pytest.raises(kv.ValidationError):
        kv.validate(wrong_type, K8S_VERSIONS[-1], strict=True)


# --- the gateway -----------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_configmap_gateway_yaml_passes_check_config(overlay: str, tmp_path: Path) -> None:
    objs = _render(overlay)
    container = _container(_one(objs, "Deployment", "gateway"), "gateway")
    env = _env_values(objs, container)
    _, text = _gateway_config(objs)
    # Every ${VAR} the config reads must be set in the pod, or the gateway refuses to start.
    assert config_variables(text) <= set(env), f"the gateway pod does not set {config_variables(text) - set(env)}"
    path = tmp_path / "gateway.yaml"
    path.write_text(text, encoding="utf-8")
    done = check_config(path, env)
    assert done.returncode == 0, done.stderr
    assert "OK" in done.stdout


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gateway_deployment_is_operable(overlay: str) -> None:
    objs = _render(overlay)
    deployment = _one(objs, "Deployment", "gateway")
    pod = deployment["spec"]["template"]["spec"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    container = _container(deployment, "gateway")
    config = yaml.safe_load(_gateway_config(objs)[1])
    args = container["args"]

    # The config file the CLI reads is the mounted ConfigMap.
    config_path = Path(args[args.index("--config") + 1])
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    assert config_path == Path(mount["mountPath"]) / "gateway.yaml"

    # Readiness on /ready, liveness on /health, on the port the CLI listens on.
    port = int(args[args.index("--port") + 1])
    named_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert named_ports["http"] == port
    for probe, path in (("readinessProbe", "/ready"), ("livenessProbe", "/health")):
        assert container[probe]["httpGet"]["path"] == path
        assert named_ports.get(container[probe]["httpGet"]["port"], container[probe]["httpGet"]["port"]) == port

    # Graceful termination outlasts preStop + the gateway's drain; liveness never cuts a drain short.
    grace = pod["terminationGracePeriodSeconds"]
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    drain = config["server"]["drain_timeout"]
    assert grace > int(pre_stop[1]) + drain, (grace, pre_stop, drain)
    liveness = container["livenessProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] > grace

    # Non-root, as the image's USER; CPU requests for the HPA.
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001 == _dockerfile_uid()
    assert "cpu" in container["resources"]["requests"]
    assert "replicas" not in deployment["spec"], "the HPA owns the replica count"

    # Image tag = the project's version.
    version = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    assert container["image"] == f"completions-gateway:{version}"

    # Service, PDB and HPA point at these pods.
    service = _one(objs, "Service", "gateway")
    assert _matches(service["spec"]["selector"], pod_labels)
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= set(named_ports)
    pdb = _one(objs, "PodDisruptionBudget", "gateway")
    assert _matches(pdb["spec"]["selector"]["matchLabels"], pod_labels)
    hpa = _one(objs, "HorizontalPodAutoscaler", "gateway")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "gateway"}
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]


def _dockerfile_uid() -> int:
    text = (DEPLOY / "docker" / "Dockerfile").read_text(encoding="utf-8")
    match = re.search(r"^USER (\d+)", text, re.M)
    assert match, "the gateway Dockerfile must switch to a numeric non-root USER"
    return int(match.group(1))


# --- vLLM ------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_vllm_pods_and_the_gateway_config_agree(overlay: str) -> None:
    objs = _render(overlay)
    sts = _one(objs, "StatefulSet")
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    container = _container(sts, "vllm")
    resources = container["resources"]
    gpus = int(resources["limits"]["nvidia.com/gpu"])
    assert gpus >= 1 and int(resources["requests"]["nvidia.com/gpu"]) == gpus
    tp = next(a for a in container["args"] if a.startswith("--tensor-parallel-size="))
    assert int(tp.split("=", 1)[1]) == gpus, "tensor parallelism must use exactly the GPUs requested"
    vllm_port = next(p["containerPort"] for p in container["ports"] if p["name"] == "http")
    assert f"--port={vllm_port}" in container["args"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"

    # The headless Service that gives the pods their DNS names.
    headless = _one(objs, "Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert _matches(headless["spec"]["selector"], pod_labels)

    # The gateway reaches every pod: either one backend per pod, named by the pod's stable
    # DNS name, or one backend discovering the pods from the headless Service's records.
    config = yaml.safe_load(_gateway_config(objs)[1])
    sts_name, svc_name = sts["metadata"]["name"], headless["metadata"]["name"]
    namespace = headless["metadata"].get("namespace", "default")
    pod_url = re.compile(rf"^http://{sts_name}-(\d+)\.{svc_name}:{vllm_port}/v1$")
    ordinals = []
    for backend in config["backends"]:
        assert backend["type"] == "vllm"
        if "discovery" in backend:
            discovery = backend["discovery"]
            assert discovery["dns"] in (svc_name, f"{svc_name}.{namespace}.svc.cluster.local"), discovery
            assert discovery.get("port", 8000) == vllm_port
            ordinals.extend(range(sts["spec"]["replicas"]))
            continue
        match = pod_url.match(backend["base_url"])
        assert match, backend["base_url"]
        ordinals.append(int(match.group(1)))
    assert sorted(ordinals) == list(range(sts["spec"]["replicas"])), "every vLLM pod reached, none twice"
    routed = {r["backend"] for m in config["models"] for r in m["routes"]}
    assert routed == {b["name"] for b in config["backends"]}

    # Gateway and vLLM read the API key from the same Secret key.
    gateway_env = {e["name"]: e for e in _container(_one(objs, "Deployment", "gateway"), "gateway")["env"]}
    vllm_env = {e["name"]: e for e in container["env"]}
    assert gateway_env["VLLM_API_KEY"]["valueFrom"] == vllm_env["VLLM_API_KEY"]["valueFrom"]
    assert gateway_env["SERVED_MODEL_NAME"]["valueFrom"] == vllm_env["SERVED_MODEL_NAME"]["valueFrom"]


def test_multi_node_spreads_vllm_over_nodes() -> None:
    sts = _one(_render("multi-node"), "StatefulSet")
    assert sts["spec"]["replicas"] > 1
    anti_affinity = sts["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    terms = anti_affinity["requiredDuringSchedulingIgnoredDuringExecution"]
    assert any(t["topologyKey"] == "kubernetes.io/hostname" for t in terms)


# --- Prometheus Operator component -----------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_monitoring_component(overlay: str) -> None:
    objs = _render(f"{overlay}+monitoring")
    services = [o for o in objs if o["kind"] == "Service"]
    jobs = set()
    for monitor in (o for o in objs if o["kind"] == "ServiceMonitor"):
        spec = monitor["spec"]
        selected = [s for s in services if _matches(spec["selector"]["matchLabels"], s["metadata"]["labels"])]
        assert len(selected) == 1, f"ServiceMonitor {monitor['metadata']['name']} selects {len(selected)} Services"
        port_names = {p["name"] for p in selected[0]["spec"]["ports"]}
        assert {e["port"] for e in spec["endpoints"]} <= port_names
        assert all(e["path"] == "/metrics" for e in spec["endpoints"])
        jobs.add(selected[0]["metadata"]["labels"][spec["jobLabel"]])
    # The alerts and the dashboard select job="gateway" (and the vLLM servers as job="vllm").
    assert jobs == {"gateway", "vllm"}

    rule = _one(objs, "PrometheusRule")
    shipped = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text(encoding="utf-8"))
    assert rule["spec"]["groups"] == shipped["groups"], (
        "components/monitoring/prometheusrule.yaml drifted from deploy/prometheus/alerts.yml: copy its groups"
    )
