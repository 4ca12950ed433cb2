"""The ``vllm-pool`` config and the multi-server ``vllm`` keys: valid shapes, and each mistake at its YAML path."""

from __future__ import annotations

import pytest

from backends.vllm.pool.resources import plan_gpus
from gateway.configfile import ConfigError, parse_config
from schemas.config import BACKEND_TYPES, VLLMBackendConfig, VLLMPoolBackendConfig

ISSUE_EXAMPLE = """\
backends:
  - name: local-llama
    type: vllm-pool
    model: /models/Llama-3.1-8B-Instruct
    gpus: [0, 1, 2, 3]
    tensor_parallel_size: 2
    port_range: [8100, 8199]
    vllm_args: ["--max-model-len", "8192", "--gpu-memory-utilization", "0.90"]
    env: {VLLM_LOGGING_LEVEL: INFO}
    command: ["vllm", "serve"]
    startup_timeout: 900
models:
  - name: llama
    routes: [{backend: local-llama, model: /models/Llama-3.1-8B-Instruct}]
"""


def pool(extra: str = "", route_model: str = "/models/Llama-3.1-8B-Instruct") -> str:
    text = ISSUE_EXAMPLE.replace("    startup_timeout: 900\n", "    startup_timeout: 900\n" + extra)
    return text.replace("model: /models/Llama-3.1-8B-Instruct}", f"model: {route_model}}}")


def problem(text: str) -> tuple[str, str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "t.yaml", env={})
    [found] = info.value.problems
    return found


def test_the_issue_example_parses_with_defaults() -> None:
    config = parse_config(ISSUE_EXAMPLE, "t.yaml", env={})
    backend = config.backends[0]
    assert isinstance(backend, VLLMPoolBackendConfig)
    assert backend.gpus == [0, 1, 2, 3] and backend.tensor_parallel_size == 2
    assert plan_gpus(backend) == [[0, 1], [2, 3]]
    assert backend.served_name == "/models/Llama-3.1-8B-Instruct"
    assert (backend.routing.strategy, backend.routing.prefix, backend.routing.metrics_interval) == (
        "score",
        "kv-events",
        0.1,
    )
    assert backend.routing.weights.model_dump() == {"queue": 2.0, "kv_cache": 2.0, "prefix": 3.0}
    assert (backend.restart.max_failures, backend.probe.failures, backend.stop_timeout) == (5, 3, 30.0)
    assert "vllm-pool" in BACKEND_TYPES


@pytest.mark.parametrize(
    ("gpus", "extra", "plan"),
    [
        ("4", "", [[0, 1], [2, 3]]),
        ("[3, 5]", "    workers: 1\n", [[3, 5]]),
        ("[]", "    workers: 3\n", [[], [], []]),
        ("[]", "", [[]]),
    ],
)
def test_gpu_plans(gpus: str, extra: str, plan: list[list[int]]) -> None:
    config = parse_config(pool(extra).replace("gpus: [0, 1, 2, 3]", f"gpus: {gpus}"), "t.yaml", env={})
    backend = config.backends[0]
    assert isinstance(backend, VLLMPoolBackendConfig)
    assert plan_gpus(backend) == plan


def test_gpus_all_is_planned_from_what_nvidia_smi_lists() -> None:
    config = parse_config(pool().replace("gpus: [0, 1, 2, 3]", "gpus: all"), "t.yaml", env={})
    backend = config.backends[0]
    assert isinstance(backend, VLLMPoolBackendConfig)
    assert plan_gpus(backend, [0, 1, 2, 3, 4, 5]) == [[0, 1], [2, 3], [4, 5]]


@pytest.mark.parametrize(
    ("text", "path", "message"),
    [
        (pool().replace("gpus: [0, 1, 2, 3]", "gpus: [0, 1, 2]"), "backends[0]", "3 GPUs in gpus cannot be split"),
        (pool().replace("gpus: [0, 1, 2, 3]", "gpus: [0, 0]"), "backends[0]", "gpus lists a GPU twice"),
        (pool("    workers: 3\n"), "backends[0]", "3 workers of 2 GPUs need more than the 4 GPUs in gpus"),
        (pool().replace("[8100, 8199]", "[8100, 8100]"), "backends[0]", "port_range holds 1 port(s) for 2 workers"),
        (pool().replace("[8100, 8199]", "[8199, 8100]"), "backends[0]", "port_range [8199, 8100] is empty"),
        (pool().replace('"8192"', '"8192", "--port", "9"'), "backends[0].vllm_args", "--port is set by the pool"),
        (pool().replace('"8192"', '"8192", "--tensor-parallel-size=4"'), "backends[0].vllm_args", "set by the pool"),
        (
            pool().replace("VLLM_LOGGING_LEVEL", "CUDA_VISIBLE_DEVICES"),
            "backends[0]",
            "CUDA_VISIBLE_DEVICES in env is set by the pool per worker",
        ),
        (pool().replace('command: ["vllm", "serve"]', "command: []"), "backends[0].command", "at least 1 item"),
        (pool(route_model="llama-8b"), "models[0].routes[0].model", "serves '/models/Llama-3.1-8B-Instruct'"),
        (pool("    surprise: 1\n"), "backends[0].surprise", "unknown key"),
        (
            pool('    routing: {kv_events: {endpoint: "tcp://{host}:5557"}}\n'),
            "backends[0]",
            "routing.kv_events is for remote vllm servers",
        ),
        (
            pool().replace('"8192"', '"8192", "--kv-events-config={}"'),
            "backends[0]",
            "--kv-events-config is set by the pool per worker",
        ),
        (pool("    routing: {weights: {queue: -1}}\n"), "backends[0].routing.weights.queue", "greater than or equal"),
    ],
)
def test_pool_mistakes_name_their_path(text: str, path: str, message: str) -> None:
    where, what = problem(text)
    assert where == path and message in what, (where, what)


def test_served_model_name_is_what_routes_name() -> None:
    config = parse_config(pool("    served_model_name: llama-8b\n", route_model="llama-8b"), "t.yaml", env={})
    backend = config.backends[0]
    assert isinstance(backend, VLLMPoolBackendConfig) and backend.served_name == "llama-8b"


def test_two_pools_share_no_port_or_gpu() -> None:
    second = "  - name: other\n    type: vllm-pool\n    model: m2\n    gpus: [3, 4]\n    port_range: [8300, 8310]\n"
    text = ISSUE_EXAMPLE.replace("models:\n", second + "models:\n", 1)
    assert problem(text) == ("backends[1].gpus", "GPU(s) [3] also in backends[0].gpus")
    text = text.replace("gpus: [3, 4]", "gpus: [4, 5]").replace("[8300, 8310]", "[8150, 8250]")
    assert problem(text) == ("backends[1].port_range", "overlaps backends[0].port_range")


# --- vllm with several servers ----------------------------------------------------------------

VLLM = """\
backends:
  - name: fleet
    type: vllm
{source}
models:
  - name: m
    routes: [{{backend: fleet, model: x}}]
"""


def test_vllm_base_urls_and_discovery() -> None:
    config = parse_config(
        VLLM.format(source="    base_urls: [http://a:8000/v1, http://b:8000/v1]\n    routing: {strategy: least-load}"),
        "t.yaml",
        env={},
    )
    backend = config.backends[0]
    assert isinstance(backend, VLLMBackendConfig)
    assert backend.base_url is None and [str(u) for u in backend.base_urls] == ["http://a:8000/v1", "http://b:8000/v1"]
    config = parse_config(VLLM.format(source="    discovery: {dns: vllm-headless.ns.svc.cluster.local}"), "t", env={})
    backend = config.backends[0]
    assert isinstance(backend, VLLMBackendConfig) and backend.discovery is not None
    assert (backend.discovery.port, backend.discovery.interval, backend.discovery.path) == (8000, 10.0, "/v1")


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("    base_url: http://a/v1\n    base_urls: [http://b/v1]", "exactly one of base_url, base_urls, discovery"),
        ("    capabilities: {}", "give exactly one of base_url, base_urls, discovery"),
        ("    base_url: http://a/v1\n    routing: {strategy: least-load}", "only with base_urls or discovery"),
        ("    base_urls: [http://a/v1, http://a/v1]", "lists a URL twice"),
        ("    base_urls: ['http://a/v1?x=1']", "query string"),
        ("    discovery: {dns: 'bad name!'}", "should match pattern"),
    ],
)
def test_vllm_source_mistakes(source: str, message: str) -> None:
    where, what = problem(VLLM.format(source=source))
    assert where.startswith("backends[0]") and message in what, (where, what)


def test_the_pools_tokenizer_is_routings_then_the_workers_then_the_model() -> None:
    from backends.vllm.pool.pool import pool_signals
    from backends.vllm.routing.dispatch import Dispatcher

    def source(text: str) -> str | None:
        backend = parse_config(text, "t.yaml", env={}).backends[0]
        assert isinstance(backend, VLLMPoolBackendConfig)
        dispatcher = Dispatcher("p", backend.routing, on_failure=print, hopeless=bool, describe=str)
        return pool_signals(backend, dispatcher).tokenizer_source

    assert source(pool()) == "/models/Llama-3.1-8B-Instruct"
    assert source(pool().replace('"8192"', '"8192", "--tokenizer=/tok"')) == "/tok"
    assert (
        source(pool("    routing: {tokenizer: /mine}\n").replace('"8192"', '"8192", "--tokenizer", "/tok"')) == "/mine"
    )
