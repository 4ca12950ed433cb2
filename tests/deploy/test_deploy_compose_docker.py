"""deploy/compose and deploy/docker.

The compose file is validated by Compose itself (``docker compose config``, or Debian's
``docker-compose`` v1 where the plugin is absent); its gateway config passes
``gateway check-config``; its pieces agree (paths, ports, grace period, Prometheus
targets, Grafana mounts). Docker cannot build images on these machines, so the Dockerfiles
get static checks only: what they copy exists and is in the build context, they run
non-root with a HEALTHCHECK on /health, and the documented config path is the one used.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import DEPLOY, ROOT, check_config, config_variables, missing

COMPOSE_DIR = DEPLOY / "compose"
COMPOSE_FILE = COMPOSE_DIR / "compose.yaml"
DOCKER = DEPLOY / "docker"
CONFIG_PATH = "/etc/gateway/gateway.yaml"


def _example_env() -> dict[str, str]:
    """The variables env.example sets (what a user copies to .env)."""
    env = {}
    for line in (COMPOSE_DIR / "env.example").read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            env[key.strip()] = value.split("#", 1)[0].strip()
    return env


def _compose(text: str) -> subprocess.CompletedProcess[str]:
    """``config`` of a compose file text, run where compose.yaml lives (its relative paths)."""
    # Only env.example's values (as a user's .env would give), not this process's environment.
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/"), **_example_env()}
    docker, compose_v1 = shutil.which("docker"), shutil.which("docker-compose")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30).returncode == 0:
        command = [docker, "compose", "-f", "-", "config"]
    elif compose_v1:
        command = [compose_v1, "-f", "-", "config"]
        # Compose v1 predates the top-level `name` (project name); everything else it checks.
        text = re.sub(r"(?m)^name:.*\n", "", text)
    else:
        missing("docker-compose")
    return subprocess.run(command, cwd=COMPOSE_DIR, input=text, env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def resolved() -> dict[str, Any]:
    """compose.yaml as Compose resolves it (variables from env.example, absolute paths)."""
    done = _compose(COMPOSE_FILE.read_text(encoding="utf-8"))
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = yaml.safe_load(done.stdout)
    return data


def _binds(service: dict[str, Any]) -> dict[str, Path]:
    """target -> source of a resolved service's bind mounts (Compose v2 long or v1 short syntax)."""
    binds = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            source, target = volume["source"], volume["target"]
        else:
            source, target = volume.split(":")[:2]
        if source.startswith("/"):
            binds[target] = Path(source)
    return binds


def _container_ports(service: dict[str, Any]) -> list[str]:
    ports = []
    for port in service.get("ports", []):
        ports.append(str(port["target"]) if isinstance(port, dict) else port.split(":")[-1].split("/")[0])
    return ports


def test_compose_file_is_valid(resolved: dict[str, Any]) -> None:
    assert set(resolved["services"]) == {"gateway", "vllm", "prometheus", "grafana"}


def test_compose_validator_rejects_a_typo() -> None:
    """The validator is live: a misspelt key is refused."""
    text = COMPOSE_FILE.read_text(encoding="utf-8").replace("    healthcheck:", "    healthchek:", 1)
    done = _compose(text)
    assert done.returncode != 0
    assert "healthchek" in done.stderr


def test_compose_paths_exist(resolved: dict[str, Any]) -> None:
    for name, service in resolved["services"].items():
        for source in _binds(service).values():
            assert source.exists(), f"{name}: bind mount {source} does not exist"
    build = resolved["services"]["gateway"]["build"]
    assert Path(build["context"]).resolve() == ROOT
    assert (ROOT / build["dockerfile"]).resolve() == DOCKER / "Dockerfile"


def test_compose_gateway_config_passes_check_config(resolved: dict[str, Any]) -> None:
    gateway = resolved["services"]["gateway"]
    env = {k: str(v) for k, v in gateway["environment"].items()}
    config_file = _binds(gateway)[CONFIG_PATH]
    assert config_file == COMPOSE_DIR / "gateway.yaml"
    assert config_variables(config_file.read_text(encoding="utf-8")) <= set(env)
    done = check_config(config_file, env)
    assert done.returncode == 0, done.stderr

    config = yaml.safe_load(config_file.read_text(encoding="utf-8"))
    # Stopping waits longer than the gateway drains.
    grace = gateway["stop_grace_period"]
    assert grace.endswith("s") and float(grace[:-1]) > config["server"]["drain_timeout"]
    # The gateway reaches vLLM by service name, on the port vLLM listens on.
    assert config["backends"][0]["base_url"] == f"http://vllm:{_vllm_port(resolved)}/v1"
    # Published port = the port the image's CMD listens on.
    assert _container_ports(gateway) == [_dockerfile_port(DOCKER / "Dockerfile")]


def _vllm_port(resolved: dict[str, Any]) -> int:
    command = resolved["services"]["vllm"]["command"]
    return int(next(a for a in command if a.startswith("--port=")).split("=", 1)[1])


def test_compose_prometheus_scrapes_the_services(resolved: dict[str, Any]) -> None:
    prometheus = resolved["services"]["prometheus"]
    mounted = {source.name: target for target, source in _binds(prometheus).items()}
    assert mounted["prometheus.yml"] == "/etc/prometheus/prometheus.yml"
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text(encoding="utf-8"))
    for rule_file in config["rule_files"]:
        assert mounted[rule_file] == f"/etc/prometheus/{rule_file}"
    targets = {
        job["job_name"]: [t for sc in job["static_configs"] for t in sc["targets"]] for job in config["scrape_configs"]
    }
    assert targets == {
        "gateway": [f"gateway:{_dockerfile_port(DOCKER / 'Dockerfile')}"],
        "vllm": [f"vllm:{_vllm_port(resolved)}"],
    }


def test_compose_grafana_provisioning(resolved: dict[str, Any]) -> None:
    grafana = resolved["services"]["grafana"]
    mounts = _binds(grafana)
    assert mounts["/etc/grafana/provisioning"] == DEPLOY / "grafana" / "provisioning"
    providers = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "dashboards" / "completions-gateway.yaml").read_text()
    )
    dashboards_dir = providers["providers"][0]["options"]["path"]
    assert mounts[dashboards_dir] == DEPLOY / "grafana" / "dashboards"
    assert list(mounts[dashboards_dir].glob("*.json"))
    sources = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    assert sources["datasources"][0]["url"] == "http://prometheus:9090"


def test_env_example_sets_every_required_variable() -> None:
    required = set(re.findall(r"\$\{(\w+):\?", COMPOSE_FILE.read_text(encoding="utf-8")))
    assert required and required <= set(_example_env())


# --- Dockerfiles (static: no image is built here) -----------------------------------------


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text(encoding="utf-8"))
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _dockerfile_port(path: Path) -> str:
    cmd = next(args for word, args in _instructions(path) if word == "CMD")
    words = yaml.safe_load(cmd)  # exec form: a JSON list
    return str(words[words.index("--port") + 1])


def _ignored(path: str, patterns: list[str]) -> bool:
    top = path.split("/", 1)[0]
    return any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(top, p) for p in patterns if not p.startswith("!"))


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.vllm-pool"])
def test_dockerfile(name: str) -> None:
    path = DOCKER / name
    steps = _instructions(path)
    words = [w for w, _ in steps]
    ignore = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert {".git", ".venv", "tests"} <= set(ignore)
    for word, args in steps:
        if word == "COPY" and "--from=" not in args:
            *sources, _ = args.split()
            for source in sources:
                assert (ROOT / source).exists(), f"{name}: COPY {source}: not in the repository"
                assert not _ignored(source, ignore), f"{name}: COPY {source}: excluded by .dockerignore"
    # The config lives at the documented path, and the command reads it.
    assert f"deploy/examples/quickstart.yaml {CONFIG_PATH}" in " ".join(a for w, a in steps if w == "COPY")
    cmd = yaml.safe_load(next(a for w, a in steps if w == "CMD"))
    assert cmd[:3] == ["serve", "--config", CONFIG_PATH]
    assert CONFIG_PATH in (ROOT / "README.md").read_text(encoding="utf-8")
    # HEALTHCHECK on /health, on the port the command listens on and the image exposes.
    port = _dockerfile_port(path)
    health = next(a for w, a in steps if w == "HEALTHCHECK")
    assert f"127.0.0.1:{port}/health" in health
    assert ("EXPOSE", port) in steps
    assert words[-1] in ("CMD", "ENTRYPOINT")


def test_gateway_dockerfile_is_multi_stage_slim_and_non_root() -> None:
    steps = _instructions(DOCKER / "Dockerfile")
    froms = [a for w, a in steps if w == "FROM"]
    assert len(froms) >= 2 and all("-slim" in f for f in froms)
    user = [a for w, a in steps if w == "USER"][-1]
    uid = user.split(":", 1)[0]
    assert uid.isdigit() and int(uid) != 0, "numeric, so Kubernetes' runAsNonRoot can verify it"


def test_vllm_pool_dockerfile_builds_on_vllm_official_image() -> None:
    steps = _instructions(DOCKER / "Dockerfile.vllm-pool")
    args = dict(a.split("=", 1) for w, a in steps if w == "ARG" and "=" in a)
    base = [a for w, a in steps if w == "FROM"][-1]
    image = args.get(base.strip("${}"), base)
    assert image.startswith("vllm/vllm-openai:v")
