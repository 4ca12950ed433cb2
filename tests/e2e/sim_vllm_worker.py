"""A ``vllm serve`` stand-in for a ``vllm-pool`` worker whose chat is ``model_upstreams``' simulated vLLM.

Invoked as the pool invokes vLLM (``sim_vllm_worker.py MODEL --host H --port P
[--served-model-name NAME] [--max-model-len N] [other vLLM flags, ignored]``): ``/health``,
``/v1/models`` (the served name, its ``root`` and ``max_model_len`` as vLLM reports them),
``/version``, an empty ``/metrics`` and ``POST /v1/chat/completions`` answered by the mock's
simulator exactly as the ``vllm`` kind's simulated server answers.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, when run as a script

from tests.e2e.model_upstreams import SimulatedUpstream


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--served-model-name")
    parser.add_argument("--max-model-len", type=int, default=4096)
    args, _ = parser.parse_known_args(argv)
    served = args.served_model_name or args.model
    upstream = SimulatedUpstream("vllm")

    async def get(request: web.Request) -> web.Response:
        if request.path == "/v1/models":
            entry = {"id": served, "object": "model", "root": args.model, "max_model_len": args.max_model_len}
            return web.json_response({"object": "list", "data": [entry]})
        if request.path == "/metrics":
            return web.Response(text="", content_type="text/plain")
        return await upstream._get(request)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", upstream._chat)
    app.router.add_get("/{tail:.*}", get)
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main(sys.argv[1:])
