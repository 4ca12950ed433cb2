"""``gateway config-schema``: the JSON Schema of the YAML config, from the models that validate it.

The committed ``deploy/gateway.schema.json`` (what the deploy configs' ``# yaml-language-server:
$schema=`` comments point at) must be exactly the command's output, and the schema must agree
with the validator on real configs: every deploy config passes it, typical mistakes fail it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.cli import main
from schemas.config import GatewayConfig

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "deploy" / "gateway.schema.json"
CONFIGS = sorted(p for p in (ROOT / "deploy").rglob("*.yaml") if re.search(r"^backends:", p.read_text(), re.M))
_SCHEMA_COMMENT = re.compile(r"^# yaml-language-server: \$schema=(\S+)$", re.M)


def schema_text(capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["config-schema"]) == 0
    return capsys.readouterr().out


def test_the_committed_schema_is_the_commands_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert COMMITTED.read_text(encoding="utf-8") == schema_text(capsys), (
        "deploy/gateway.schema.json is stale: regenerate it with "
        "`python -m gateway config-schema > deploy/gateway.schema.json`"
    )


def test_the_command_runs_as_a_process() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gateway", "config-schema"], cwd=ROOT, capture_output=True, check=True, timeout=60
    )
    assert json.loads(out.stdout)["$schema"] == "https://json-schema.org/draft/2020-12/schema"


REFERENCE = {"$ref": "#/$defs/EnvReference"}


def without_references(node: Any) -> Any:
    """The schema as pydantic generated it: each ``anyOf [S, EnvReference]`` back to ``S``."""
    if isinstance(node, list):
        return [without_references(item) for item in node]
    if not isinstance(node, dict):
        return node
    if node.get("anyOf", [None])[-1] == REFERENCE:
        [inner] = node["anyOf"][:-1]
        node = {**{k: v for k, v in node.items() if k != "anyOf"}, **inner}
    return {key: without_references(value) for key, value in node.items()}


def test_it_is_the_validators_schema(capsys: pytest.CaptureFixture[str]) -> None:
    schema = json.loads(schema_text(capsys))
    generated = GatewayConfig.model_json_schema()
    assert without_references(schema["properties"]) == generated["properties"]
    assert schema["required"] == ["backends", "models"]
    assert set(schema["$defs"]) == {*generated["$defs"], "EnvReference"}
    routing = without_references(schema["$defs"]["PoolRoutingConfig"])["properties"]["strategy"]["enum"]
    assert "prefix-hash" in routing
    # A SecretStr default is shown as written, not masked (an editor would suggest the mask).
    assert schema["$defs"]["AuthConfig"]["properties"]["store"]["default"] == "memory"
    assert "**********" not in json.dumps(schema)


def test_every_deploy_config_points_at_the_committed_schema() -> None:
    assert len(CONFIGS) >= 4
    for path in CONFIGS:
        match = _SCHEMA_COMMENT.search(path.read_text(encoding="utf-8").split("\n", 1)[0])
        assert match, f"{path.relative_to(ROOT)}: first line must be the yaml-language-server $schema comment"
        assert (path.parent / match.group(1)).resolve() == COMMITTED, path


def _validator() -> Any:
    jsonschema_rs = pytest.importorskip("jsonschema_rs")
    return jsonschema_rs.Draft202012Validator(json.loads(COMMITTED.read_text(encoding="utf-8")))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_deploy_configs_pass_the_schema(path: Path) -> None:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    errors = [e.message for e in _validator().iter_errors(data)]
    assert errors == []


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (lambda c: c["server"].update(prot=8080), "prot"),  # a typo'd key
        (lambda c: c["backends"][0].update(type="vlm"), "vlm"),  # an unknown backend type
        (lambda c: c["server"].update(port=70000), "70000"),  # out of bounds
        (lambda c: c.pop("models"), "models"),  # a required section
    ],
)
def test_typical_mistakes_fail_the_schema(change: Any, fragment: str) -> None:
    config: dict[str, Any] = yaml.safe_load((ROOT / "deploy" / "examples" / "quickstart.yaml").read_text())
    change(config)
    errors = [e.message for e in _validator().iter_errors(config)]
    assert errors and any(fragment in e for e in errors), errors


def test_references_pass_where_the_gateway_reads_them() -> None:
    """``port: ${PORT}`` and friends: the gateway reads them from the environment, so editors must not flag them."""
    config: dict[str, Any] = yaml.safe_load((ROOT / "deploy" / "examples" / "quickstart.yaml").read_text())
    config["server"].update(port="${PORT}", host="${HOST:-0.0.0.0}", access_log="${ACCESS_LOG:-false}")
    config["backends"].append(
        {"name": "v", "type": "vllm", "base_url": "http://${VLLM_HOST}:8000/v1", "timeout": {"connect": "${T:?}"}}
    )
    config["models"][0].update(name="${SERVED_MODEL_NAME}", strategy="${STRATEGY:-failover}")
    assert [e.message for e in _validator().iter_errors(config)] == []
    config["server"]["port"] = "eighty"  # not a number, and no reference either
    assert len(list(_validator().iter_errors(config))) == 1
