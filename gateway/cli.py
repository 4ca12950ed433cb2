"""The ``gateway`` command: ``serve``, ``check-config`` (``--probe``), ``config-schema``, ``pool status`` and
``keys usage`` (``worker`` is internal: ``serve --workers N`` starts it, and ``--help`` does not list it)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from pydantic import SecretStr
from pydantic.json_schema import GenerateJsonSchema

from gateway.configfile import ConfigError, config_error, endpoint_config_problems, load_config
from gateway.keys_cli import add_keys_parser, keys_command
from gateway.pool_cli import add_pool_parser, pool_command
from gateway.tracing.settings import trace_problems
from gateway.version import PYTHON_VERSION, gateway_version
from gateway.workers.cpus import available_cpus
from gateway.workers.worker import add_worker_parser, worker_main
from schemas.config import GatewayConfig, ServerConfig, worker_notes, worker_problems

__all__ = ["main"]

log = logging.getLogger("gateway")
DESCRIPTION = (
    "An OpenAI-compatible LLM gateway: Completions, Chat Completions, Responses, embeddings and rerank "
    "in front of OpenAI-compatible APIs, vLLM (servers or a pool it runs), TGI, Ollama, llama.cpp and TEI, "
    "described in one YAML file. Every request is checked against a strict schema and what its backend "
    "can honour; retries, failover, per-key limits, Prometheus metrics."
)
T = TypeVar("T")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gateway", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"%(prog)s {gateway_version()}")
    # The metavar lists what an operator runs: the internal ``worker`` is left out (add_worker_parser).
    sub = parser.add_subparsers(dest="command", required=True, metavar="{serve,check-config,config-schema,pool}")
    serve = sub.add_parser("serve", help="serve the API described by a YAML config")
    serve.add_argument("--config", "-c", required=True, help="path to the gateway YAML")
    serve.add_argument("--host", help="listen address (overrides server.host)")
    serve.add_argument("--port", type=int, help="listen port (overrides server.port)")
    serve.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    serve.add_argument(
        "--workers",
        type=_workers_arg,
        default=os.environ.get("GATEWAY_WORKERS", "1"),
        help="processes serving requests: a number, or 'auto' for the CPUs this process may use "
        "(affinity and cgroup quota); default 1 (env GATEWAY_WORKERS)",
    )
    check = sub.add_parser("check-config", help="validate a YAML config and print every problem")
    check.add_argument("path")
    check.add_argument("--workers", type=_workers_arg, default="1", help="also check it for N worker processes")
    check.add_argument(
        "--probe",
        action="store_true",
        help="also call each remote backend once: a base_url missing /v1, a route's model the backend does "
        "not list, unreachable backends (exit status 1 if any)",
    )
    add_worker_parser(sub)
    sub.add_parser("config-schema", help="print the JSON Schema of the YAML config (for editors)")
    add_pool_parser(sub)
    add_keys_parser(sub)
    return parser


def _workers_arg(text: str) -> int:
    """``--workers``: a positive count or ``auto`` (argparse also applies this to the default)."""
    if text == "auto":
        return available_cpus()
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'auto', got {text!r}") from None
    if not 1 <= count <= 1024:
        raise argparse.ArgumentTypeError(f"expected 1..1024 workers, got {count}")
    return count


def _check(path: str, workers: int = 1, *, probe: bool = False) -> int:
    try:
        config = load_config(path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    served = endpoint_config_problems(config) + trace_problems(config, os.environ)
    if served:
        print(config_error(path, served), file=sys.stderr)
        return 1
    problems = worker_problems(config, workers)
    if problems:
        print(f"{path}: not servable with {workers} workers:", *problems, sep="\n  ", file=sys.stderr)
        return 1
    print(f"{path}: OK ({len(config.backends)} backends, {len(config.models)} models)")
    for note in worker_notes(config, workers):
        print(f"  note: {note}")
    if workers > 1:
        from backends.registry import shared_configs

        for b in shared_configs(config.backends):  # what the control process runs once (gateway.workers.pools)
            what = "its vLLM processes" if b.type == "vllm-pool" else "its discovery, probes and scrapes"
            print(f"  {b.name}: {what} run once in the control process; the {workers} workers route over them")
    return _probe(path, config) if probe else 0


def _probe(path: str, config: GatewayConfig) -> int:
    """``check-config --probe``: each remote backend called once (gateway.probe); 1 when anything was found."""
    from gateway.probe import probe

    findings = asyncio.run(probe(config))
    if findings:
        print(f"{path}: the probe found {len(findings)} problem(s):", *findings, sep="\n  ", file=sys.stderr)
        return 1
    print(f"{path}: probe: every remote backend answered as configured")
    return 0


class _ConfigSchema(GenerateJsonSchema):
    def encode_default(self, dft: Any) -> Any:
        # A SecretStr default is written in our source, not a secret: show it (auth.store's
        # "memory"), not the "**********" its str() gives, which an editor would suggest.
        if isinstance(dft, SecretStr):
            return dft.get_secret_value()
        return super().encode_default(dft)


# A string holding a ${VAR} reference (gateway.config_env): any typed value may be written so.
ENV_REFERENCE = {
    "type": "string",
    "pattern": r"\$\{[A-Za-z_][A-Za-z0-9_]*(:?[-?+][^}]*)?\}",
    "description": "${VAR}, ${VAR:-default} or ${VAR:?message}: read from the environment at load",
}
_SUBSCHEMA_MAPS = ("properties", "$defs", "patternProperties")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMAS = ("items", "additionalProperties", "not")
_CONSTRAINED = ("pattern", "format", "enum", "minLength", "maxLength")


def _allow_references(schema: Any) -> Any:
    """``schema`` where every number, boolean, choice or constrained string may also be a ``${VAR}``
    reference, as the gateway reads it (a discriminator's ``const`` stays as it is)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: _allow_references(sub) for name, sub in out[key].items()}
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_allow_references(sub) for sub in out[key]]
    for key in _SUBSCHEMAS:
        if isinstance(out.get(key), dict):
            out[key] = _allow_references(out[key])
    kind = out.get("type")
    if kind in ("integer", "number", "boolean") or (
        kind in ("string", None) and "$ref" not in out and any(k in out for k in _CONSTRAINED)
    ):
        # The annotations stay outside, where editors show them.
        notes = {k: out.pop(k) for k in ("title", "description", "default") if k in out}
        return {**notes, "anyOf": [out, {"$ref": "#/$defs/EnvReference"}]}
    return out


def config_schema() -> str:
    """The JSON Schema of the YAML config, from the models that validate it (``GatewayConfig``).

    Any typed value may be a ``${VAR}`` reference, as the gateway reads it. Model-level rules
    (names that must match, overlapping port ranges) are beyond a schema: ``gateway check-config``
    remains the full check.
    """
    schema = _allow_references(GatewayConfig.model_json_schema(schema_generator=_ConfigSchema))
    schema["$defs"]["EnvReference"] = ENV_REFERENCE
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **schema,
        "title": "completions-gateway config",
        "description": "Generated by `gateway config-schema`; `gateway check-config` checks what a schema cannot.",
    }
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def _serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    server = config.server.model_copy(update=overrides)
    served = endpoint_config_problems(config) + trace_problems(config, os.environ)
    if served:
        print(config_error(args.config, served), file=sys.stderr)
        return 1
    problems = worker_problems(config, args.workers)
    if problems:
        print(f"{args.config}: not servable with {args.workers} workers:", *problems, sep="\n  ", file=sys.stderr)
        return 1
    if args.workers > 1:
        return _serve_workers(args, server, config)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency, but not on every platform
        loop_factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    else:
        loop_factory = uvloop.new_event_loop

    from gateway.app import create_app
    from gateway.reload import enable_reload
    from gateway.shutdown import serve

    try:
        app = create_app(config.model_copy(update={"server": server}))
    except ConfigError as exc:  # what the built backends cannot serve (models[].endpoints)
        print(exc, file=sys.stderr)
        return 1
    enable_reload(app, args.config, server_overrides=overrides)  # SIGHUP re-reads the config: gateway.reload
    log.info(
        "gateway %s (Python %s) serving %d model(s) over %d backend(s) on http://%s:%d",
        gateway_version(),
        PYTHON_VERSION,
        len(config.models),
        len(config.backends),
        server.host,
        server.port,
    )
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        # Until SIGTERM/SIGINT, then a drain: see gateway.shutdown.
        runner.run(
            _probing(
                config,
                args.config,
                serve(
                    app,
                    host=server.host,
                    port=server.port,
                    drain_timeout=server.drain_timeout,
                    drain_delay=server.drain_delay,
                    access_log=logging.getLogger("gateway.access") if server.access_log else None,
                ),
            )
        )
    return 0


async def _probing(config: GatewayConfig, source: str, running: Coroutine[Any, Any, T]) -> T:
    """``running`` with the start-up probe beside it (gateway.probe: its findings are logged as warnings)."""
    from gateway.probe import probe_in_background

    task = probe_in_background(config, source)
    try:
        return await running
    finally:
        task.cancel()


def _serve_workers(args: argparse.Namespace, server: ServerConfig, config: GatewayConfig) -> int:
    """N workers on one socket under a control process (gateway.workers.control), which runs the pools
    and the multi-server vllm backends' discovery and probes once."""
    from backends.registry import shared_configs
    from gateway.workers.control import Control, bind

    try:
        sock = bind(server.host, server.port)
    except OSError as exc:
        print(f"cannot listen on {server.host}:{server.port}: {exc}", file=sys.stderr)
        return 1
    log.info(
        "gateway %s (Python %s) control process: %d workers on http://%s:%d",
        gateway_version(),
        PYTHON_VERSION,
        args.workers,
        server.host,
        server.port,
    )
    control = Control(
        args.config,
        args.workers,
        sock,
        drain_timeout=server.drain_timeout,
        log_level=args.log_level,
        pools=shared_configs(config.backends),
        config=config,
    )
    return asyncio.run(_probing(config, args.config, control.run()))


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "check-config":
        return _check(args.path, args.workers, probe=args.probe)
    if args.command == "worker":
        return worker_main(args)
    if args.command == "config-schema":
        sys.stdout.write(config_schema())
        return 0
    if args.command == "pool":
        return pool_command(args)
    if args.command == "keys":
        return keys_command(args)
    return _serve(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
