"""The ``gateway`` command: ``serve``, ``check-config`` and ``pool status``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable, Sequence

from gateway.configfile import ConfigError, load_config
from gateway.pool_cli import add_pool_parser, pool_command

__all__ = ["main"]

log = logging.getLogger("gateway")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gateway", description="OpenAI Completions gateway.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the API described by a YAML config")
    serve.add_argument("--config", "-c", required=True, help="path to the gateway YAML")
    serve.add_argument("--host", help="listen address (overrides server.host)")
    serve.add_argument("--port", type=int, help="listen port (overrides server.port)")
    serve.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    check = sub.add_parser("check-config", help="validate a YAML config and print every problem")
    check.add_argument("path")
    add_pool_parser(sub)
    return parser


def _check(path: str) -> int:
    try:
        config = load_config(path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"{path}: OK ({len(config.backends)} backends, {len(config.models)} models)")
    return 0


def _serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    server = config.server.model_copy(
        update={k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    )
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency, but not on every platform
        loop_factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    else:
        loop_factory = uvloop.new_event_loop

    from gateway.app import create_app
    from gateway.shutdown import serve

    app = create_app(config.model_copy(update={"server": server}))
    log.info(
        "gateway serving %d model(s) over %d backend(s) on http://%s:%d",
        len(config.models),
        len(config.backends),
        server.host,
        server.port,
    )
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        # Until SIGTERM/SIGINT, then a drain: see gateway.shutdown.
        runner.run(
            serve(
                app,
                host=server.host,
                port=server.port,
                drain_timeout=server.drain_timeout,
                drain_delay=server.drain_delay,
                access_log=logging.getLogger("gateway.access") if server.access_log else None,
            )
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "check-config":
        return _check(args.path)
    if args.command == "pool":
        return pool_command(args)
    return _serve(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
