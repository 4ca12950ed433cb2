"""Whether tracing is on, and how: the ``telemetry`` section over the standard ``OTEL_*`` variables.

A key the section sets wins; a key it leaves out takes its variable, then the default.
Without the section, tracing is on only when ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (and ``OTEL_SDK_DISABLED`` is not ``true``, nor
``OTEL_TRACES_EXPORTER`` ``none``). Nothing here imports OpenTelemetry: :func:`trace_problems`
only looks for the optional extra, so ``gateway check-config`` refuses a config that turns
tracing on where the extra is missing.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote

from schemas.config import GatewayConfig, TelemetryConfig

__all__ = ["SAMPLERS", "TraceSettings", "resolve", "trace_problems"]

# OTEL_TRACES_SAMPLER values the gateway honours: (parent decides, ratio taken from the argument).
SAMPLERS: Mapping[str, tuple[bool, float | None]] = {
    "always_on": (False, 1.0),
    "always_off": (False, 0.0),
    "traceidratio": (False, None),
    "parentbased_always_on": (True, 1.0),
    "parentbased_always_off": (True, 0.0),
    "parentbased_traceidratio": (True, None),
}
_EXTRA = "pip install 'completions-gateway[otel]'"


@dataclass(frozen=True, slots=True)
class TraceSettings:
    """Tracing as resolved at start; ``source`` names where the endpoint came from (for errors)."""

    endpoint: str
    protocol: str  # "http/protobuf" or "grpc"
    sample_ratio: float
    parent_based: bool
    service_name: str
    capture_content: bool
    headers: Mapping[str, str] = field(repr=False)  # secrets: kept out of repr
    max_queue_size: int = 4096
    export_timeout: float = 10.0
    schedule_delay: float = 1.0  # seconds between exports at most (OTEL_BSP_SCHEDULE_DELAY, in ms there)
    source: str = "telemetry"
    resource: Mapping[str, str] = field(default_factory=dict)


class SettingsError(ValueError):
    """A tracing setting that cannot be used; ``path`` is the YAML path or the variable's name."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


def _pairs(raw: str, *, lower: bool = False) -> dict[str, str]:
    """``k=v,k2=v2`` (``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_EXPORTER_OTLP_HEADERS``), values percent-decoded."""
    out: dict[str, str] = {}
    for item in raw.split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        if sep and key:
            out[key.lower() if lower else key] = unquote(value.strip())
    return out


def _delay(env: Mapping[str, str]) -> float:
    raw = env.get("OTEL_BSP_SCHEDULE_DELAY", "")
    try:
        millis = float(raw) if raw else 1000.0
    except ValueError:
        raise SettingsError("OTEL_BSP_SCHEDULE_DELAY", f"{raw!r} is not a number of milliseconds") from None
    if not 1 <= millis <= 60_000:
        raise SettingsError("OTEL_BSP_SCHEDULE_DELAY", f"{millis:g} ms is not between 1 and 60000")
    return millis / 1000


def _sampler(env: Mapping[str, str]) -> tuple[bool, float] | None:
    """(parent_based, ratio) from ``OTEL_TRACES_SAMPLER(_ARG)``; None when unset."""
    name = env.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    if not name:
        return None
    if name not in SAMPLERS:
        raise SettingsError("OTEL_TRACES_SAMPLER", f"{name!r} is not one of {', '.join(SAMPLERS)}")
    parent_based, ratio = SAMPLERS[name]
    if ratio is None:
        arg = env.get("OTEL_TRACES_SAMPLER_ARG", "1.0")
        try:
            ratio = float(arg)
        except ValueError:
            raise SettingsError("OTEL_TRACES_SAMPLER_ARG", f"{arg!r} is not a number") from None
        if not 0.0 <= ratio <= 1.0:
            raise SettingsError("OTEL_TRACES_SAMPLER_ARG", f"{ratio} is not between 0 and 1")
    return parent_based, ratio


def resolve(config: GatewayConfig, env: Mapping[str, str]) -> TraceSettings | None:
    """The tracing this config and environment ask for; None: tracing is off. Raises :class:`SettingsError`."""
    section = config.telemetry
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if section is None and env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return None
    endpoint_var = next(
        (n for n in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT") if env.get(n)), None
    )
    if section is None and endpoint_var is None:
        return None
    tc = section if section is not None else TelemetryConfig()
    given = tc.model_fields_set
    if "otlp_endpoint" in given and tc.otlp_endpoint is not None:
        endpoint, source = str(tc.otlp_endpoint), "telemetry.otlp_endpoint"
    elif endpoint_var is not None:
        endpoint, source = env[endpoint_var], endpoint_var
    else:
        raise SettingsError(
            "telemetry.otlp_endpoint", "tracing needs a collector: set it, or OTEL_EXPORTER_OTLP_ENDPOINT"
        )
    protocol: str = tc.protocol
    if "protocol" not in given:
        protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or protocol
        if protocol not in ("http/protobuf", "grpc"):
            raise SettingsError("OTEL_EXPORTER_OTLP_PROTOCOL", f"{protocol!r}: the gateway exports http/protobuf, grpc")
    parent_based, ratio = tc.parent_based, tc.sample_ratio
    sampled = _sampler(env)
    if sampled is not None:
        parent_based = parent_based if "parent_based" in given else sampled[0]
        ratio = ratio if "sample_ratio" in given else sampled[1]
    service = tc.service_name if "service_name" in given else env.get("OTEL_SERVICE_NAME") or tc.service_name
    env_headers = env.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or env.get("OTEL_EXPORTER_OTLP_HEADERS") or ""
    headers = _pairs(env_headers, lower=True) | {k.lower(): v.get_secret_value() for k, v in tc.headers.items()}
    return TraceSettings(
        endpoint=endpoint,
        protocol=protocol,
        sample_ratio=ratio,
        parent_based=parent_based,
        service_name=service,
        capture_content=tc.capture_content,
        headers=headers,
        max_queue_size=tc.max_queue_size,
        export_timeout=tc.export_timeout,
        schedule_delay=_delay(env),
        source=source,
        resource=_pairs(env.get("OTEL_RESOURCE_ATTRIBUTES", "")),
    )


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except ModuleNotFoundError:  # a parent package is missing
        return True


def trace_problems(config: GatewayConfig, env: Mapping[str, str]) -> list[tuple[str, str]]:
    """``(path, message)`` for tracing that is asked for and cannot run here (bad variables, the extra missing)."""
    try:
        settings = resolve(config, env)
    except SettingsError as exc:
        return [(exc.path, exc.message)]
    if settings is None:
        return []
    exporter = "opentelemetry.exporter.otlp.proto." + ("grpc" if settings.protocol == "grpc" else "http")
    for module in ("opentelemetry.sdk.trace", exporter + ".trace_exporter"):
        if _missing(module):
            return [
                (
                    "telemetry" if settings.source.startswith("telemetry") else settings.source,
                    f"tracing is configured ({settings.source}) but the OpenTelemetry SDK and its OTLP "
                    f"{settings.protocol} exporter are not installed ({module} is missing): {_EXTRA}",
                )
            ]
    return []
