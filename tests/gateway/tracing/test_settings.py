"""Tracing is off unless configured; the ``telemetry`` section over the standard ``OTEL_*`` variables; a config
asking for tracing without the ``otel`` extra is refused by name; W3C headers and the ratio sampler."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gateway.configfile import parse_config
from gateway.tracing.settings import SettingsError, resolve, trace_problems
from gateway.tracing.w3c import Sampler, parse_traceparent, traceparent

BASE = """
backends: [{name: up, type: openai, base_url: 'http://127.0.0.1:9/v1'}]
models: [{name: m, routes: [{backend: up, model: x}]}]
"""


def _config(telemetry: str = ""):  # type: ignore[no-untyped-def]
    return parse_config(BASE + telemetry, "<t>", env={})


def test_off_without_section_or_variables() -> None:
    assert resolve(_config(), {}) is None
    assert resolve(_config(), {"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"}) is None


def test_standard_variables_turn_it_on() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.01",
        "OTEL_SERVICE_NAME": "edge-gw",
        "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20abc,x-team=ml",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod,k8s.pod.name=gw-0",
    }
    s = resolve(_config(), env)
    assert s is not None
    assert (s.endpoint, s.protocol, s.sample_ratio, s.parent_based) == ("http://collector:4317", "grpc", 0.01, True)
    assert s.service_name == "edge-gw" and s.source == "OTEL_EXPORTER_OTLP_ENDPOINT"
    assert s.headers == {"authorization": "Bearer abc", "x-team": "ml"}
    assert s.resource == {"deployment.environment": "prod", "k8s.pod.name": "gw-0"}
    assert "abc" not in repr(s)  # headers are secrets
    assert resolve(_config(), {**env, "OTEL_SDK_DISABLED": "true"}) is None
    assert resolve(_config(), {**env, "OTEL_TRACES_EXPORTER": "none"}) is None


def test_section_keys_win_over_variables() -> None:
    config = _config("telemetry: {otlp_endpoint: 'http://a:4318', sample_ratio: 0.5, service_name: mine}\n")
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://b:4318",
        "OTEL_TRACES_SAMPLER": "always_off",
        "OTEL_SERVICE_NAME": "env",
    }
    s = resolve(config, env)
    assert s is not None
    assert (s.endpoint, s.sample_ratio, s.service_name) == ("http://a:4318/", 0.5, "mine")
    assert s.parent_based is False  # not set in the section: always_off's
    left_out = resolve(_config("telemetry: {capture_content: true}\n"), env)
    assert left_out is not None and left_out.endpoint == "http://b:4318" and left_out.sample_ratio == 0.0


@pytest.mark.parametrize(
    ("telemetry", "env", "path"),
    [
        ("telemetry: {sample_ratio: 0.5}\n", {}, "telemetry.otlp_endpoint"),
        (
            "",
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_TRACES_SAMPLER": "jaeger_remote"},
            "OTEL_TRACES_SAMPLER",
        ),
        (
            "",
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c",
                "OTEL_TRACES_SAMPLER": "traceidratio",
                "OTEL_TRACES_SAMPLER_ARG": "2",
            },
            "OTEL_TRACES_SAMPLER_ARG",
        ),
        (
            "",
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ),
    ],
)
def test_unusable_settings_are_named(telemetry: str, env: dict[str, str], path: str) -> None:
    with pytest.raises(SettingsError) as caught:
        resolve(_config(telemetry), env)
    assert caught.value.path == path
    assert trace_problems(_config(telemetry), env)[0][0] == path


def test_config_section_is_strict() -> None:
    from gateway.configfile import ConfigError

    with pytest.raises(ConfigError, match=r"telemetry\.sample_ratio"):
        _config("telemetry: {otlp_endpoint: 'http://a', sample_ratio: 1.5}\n")
    with pytest.raises(ConfigError, match=r"telemetry\.protocol"):
        _config("telemetry: {otlp_endpoint: 'http://a', protocol: http/json}\n")


_WITHOUT_EXTRA = """
import sys, importlib.abc
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(name)
        return None
sys.meta_path.insert(0, Hide())
from gateway.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("how", ["section", "variable"])
def test_check_config_refuses_tracing_without_the_extra(tmp_path: Path, how: str) -> None:
    config = tmp_path / "gw.yaml"
    env = {"PATH": "/usr/bin:/bin"}
    if how == "section":
        config.write_text(BASE + "telemetry: {otlp_endpoint: 'http://collector:4318'}\n")
    else:
        config.write_text(BASE)
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://collector:4318"
    run = _check_without_extra(config, env)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "pip install 'completions-gateway[otel]'" in run.stderr
    assert ("telemetry:" if how == "section" else "OTEL_EXPORTER_OTLP_ENDPOINT:") in run.stderr
    # The same config without tracing is fine in that environment: nothing of OpenTelemetry is needed.
    config.write_text(BASE)
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    ok = _check_without_extra(config, env)
    assert ok.returncode == 0, ok.stderr


def _check_without_extra(config: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``gateway check-config`` in a process where no ``opentelemetry`` module can be imported."""
    root = Path(__file__).resolve().parents[3]
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT_EXTRA, "check-config", str(config)],
        capture_output=True,
        text=True,
        cwd=root,
        env={**env, "PYTHONPATH": str(root)},
        timeout=60,
    )


def test_tracing_off_imports_no_opentelemetry() -> None:
    code = textwrap.dedent(
        """
        import sys
        from gateway.app import create_app
        from gateway.configfile import parse_config
        config = parse_config('''%s''', "<t>", env={})
        create_app(config, env={})
        loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
        print(loaded)
        sys.exit(1 if loaded else 0)
        """
    ).replace("%s", BASE)
    root = Path(__file__).resolve().parents[3]
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def test_only_the_sdk_module_imports_opentelemetry() -> None:
    root = Path(__file__).resolve().parents[3]
    importers = sorted(
        str(path.relative_to(root))
        for package in ("schemas", "backends", "gateway")
        for path in (root / package).rglob("*.py")
        if any(
            line.lstrip().startswith(("import opentelemetry", "from opentelemetry"))
            for line in path.read_text().splitlines()
        )
    )
    assert importers == ["gateway/tracing/sdk.py"]


def test_traceparent_parsing() -> None:
    ok = parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "a=1")
    assert ok is not None and ok.sampled and ok.tracestate == "a=1"
    assert ok.trace_id == 0x4BF92F3577B34DA6A3CE929D0E0E4736 and ok.span_id == 0x00F067AA0BA902B7
    assert traceparent(ok.trace_id, ok.span_id, True) == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    future = parse_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-extra")
    assert future is not None and not future.sampled
    for bad in (
        "",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # no flags
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # zero span id
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper case
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",  # version 00 has nothing after
    ):
        assert parse_traceparent(bad) is None, bad
    long_state = parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "x" * 600)
    assert long_state is not None and long_state.tracestate is None


def test_ratio_sampler_matches_the_ratio_and_the_parent() -> None:
    never, always, some = (
        Sampler(0.0, parent_based=False),
        Sampler(1.0, parent_based=False),
        Sampler(0.25, parent_based=False),
    )
    assert not any(never.sampled(None)[0] for _ in range(1000))
    assert all(always.sampled(None)[0] for _ in range(1000))
    share = sum(some.sampled(None)[0] for _ in range(20000)) / 20000
    assert 0.22 < share < 0.28
    parent = parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    assert Sampler(0.0, parent_based=True).sampled(parent) == (True, parent.trace_id)  # type: ignore[union-attr]
    # Not parent-based: the trace id decides, the same way every time (and as OpenTelemetry's TraceIdRatioBased).
    from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

    for ratio in (0.1, 0.5, 0.9):
        theirs = TraceIdRatioBased(ratio)
        for trace_id in range(1, 2**128, 2**121 + 12345):
            ours = Sampler(ratio, parent_based=False).sampled(
                parse_traceparent(f"00-{trace_id:032x}-00f067aa0ba902b7-00")
            )[0]
            assert ours == theirs.should_sample(None, trace_id, "x").decision.is_sampled()


def test_a_reload_that_changes_telemetry_asks_for_a_restart() -> None:
    from gateway.reload import restart_needed

    old = _config("telemetry: {otlp_endpoint: 'http://a:4318'}\n")
    assert restart_needed(old, old) == []
    new = _config("telemetry: {otlp_endpoint: 'http://a:4318', sample_ratio: 0.1}\n")
    assert [path for path, _ in restart_needed(old, new)] == ["telemetry"]


def test_tracestate_is_passed_on_only_when_valid() -> None:
    header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    for sent, kept in [
        ("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE", "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"),
        (" a=1 , ,b=2 ", "a=1,b=2"),  # optional whitespace and empty members, as the spec allows
        ("tenant@system=v", "tenant@system=v"),
        ("@@bad=x", None),  # an invalid key: the whole header is dropped, never repaired
        ("a=", None),
        ("Upper=1", None),
        ("a=1," * 33, None),  # more than 32 members
        ("x=" + "y" * 600, None),  # longer than the gateway passes on
    ]:
        parent = parse_traceparent(header, sent)
        assert parent is not None and parent.tracestate == kept, sent
