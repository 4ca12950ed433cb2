"""The ``vllm-pool`` backend (workers the gateway starts and supervises) and the routing,
probe and discovery settings it shares with multi-server ``vllm``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from schemas.config.common import TimeoutConfig, UpstreamLimitsConfig, _BackendBase, _Strict


class ScoreWeights(_Strict):
    """``strategy: score``: the weight of each term in a server's score (the highest sum wins).

    The defaults are the Gateway API Inference Extension's endpoint picker's (queue 2, KV cache 2,
    prefix 3). A weight of 0 leaves its term out.
    """

    queue: Annotated[float, Field(ge=0, le=100)] = 2.0
    kv_cache: Annotated[float, Field(ge=0, le=100)] = 2.0
    prefix: Annotated[float, Field(ge=0, le=100)] = 3.0


class KVEventsConfig(_Strict):
    """Where a remote vLLM server publishes its KV-cache events (``vllm serve --kv-events-config``).

    ``endpoint``: the ZMQ address the gateway connects to, ``{host}`` standing for each server's host
    (so one line serves ``base_urls`` and ``discovery``): vLLM must bind it, e.g. started with
    ``{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", "topic": "kv"}``.
    ``hash_seed``: the servers' ``PYTHONHASHSEED`` when set (vLLM seeds its block hashes with it).
    """

    endpoint: Annotated[str, Field(pattern=r"^(tcp|ipc)://\S+$", max_length=1024)] = "tcp://{host}:5557"
    topic: Annotated[str, Field(max_length=256)] = ""
    hash_seed: Annotated[str, Field(max_length=256)] | None = None


class PoolRoutingConfig(_Strict):
    """How requests are spread over a pool's workers (``vllm-pool``, or ``vllm`` with several URLs).

    ``score`` (the default): every server gets a weighted sum of a queue score, a KV-cache score and
    a prefix score (``weights``), from its own ``/metrics`` (scraped every ``metrics_interval``) and
    from its KV-cache events (``prefix: kv-events``: which prompt blocks it really holds) or the
    prompt's hash (``prefix: approximate``); a server whose load is over ``max_load_ratio`` times the
    mean is passed over. Every gateway process and replica scores alike (no learned state).
    ``prefix-affinity``: requests whose prompts share leading blocks go to the worker that served
    that prefix last (it likely holds it in its KV cache), unless that worker is overloaded;
    everything else goes to the least loaded worker. It learns from this process's own traffic, so
    other gateway workers and replicas learn apart.
    ``prefix-hash``: a stable hash of the prompt's first block (``block_chars`` characters or
    ``block_tokens`` ids: about the shared part's length) picks the worker by rendezvous
    hashing with bounded load (at most 1.25x the average), the same worker in every gateway
    process and replica without shared state. ``least-load``: load only. ``round-robin``: neither
    (a baseline).
    """

    strategy: Literal["score", "prefix-affinity", "prefix-hash", "least-load", "round-robin"] = "score"
    # Prompt blocks hashed for affinity: characters per block of a text prompt, token ids per
    # block of a token prompt; only whole blocks count (as in vLLM's prefix cache).
    block_chars: Annotated[int, Field(ge=16, le=1_000_000)] = 256
    block_tokens: Annotated[int, Field(ge=1, le=100_000)] = 64
    max_blocks: Annotated[int, Field(ge=1, le=1024)] = 16
    # Bound of each worker's LRU of prefix-block hashes.
    affinity_entries: Annotated[int, Field(ge=1, le=10_000_000)] = 8192
    # The affine worker is skipped when its load exceeds the least loaded worker's by more
    # than this (load = requests in flight from us + requests waiting in its own queue) ...
    overload_margin: Annotated[float, Field(ge=0)] = 4.0
    # ... or when its KV cache is at least this full.
    kv_cache_high: Annotated[float, Field(gt=0, le=1)] = 0.95
    # ``score``: the terms' weights, where the prefix score comes from, the load bound.
    weights: ScoreWeights = Field(default_factory=ScoreWeights)
    prefix: Literal["kv-events", "approximate"] = "kv-events"
    max_load_ratio: Annotated[float, Field(ge=1, le=100)] = 1.5
    # ``prefix: kv-events``: where a remote server publishes (a ``vllm-pool`` sets its workers' own),
    # the tokenizer (a directory with ``tokenizer.json`` or the file; default: the served model's),
    # and the most block hashes kept per server (about 124 bytes each, in every routing process:
    # 262,144 blocks of 16 tokens = 4M tokens of cache for about 32 MB).
    kv_events: KVEventsConfig | None = None
    tokenizer: Annotated[str, Field(min_length=1, max_length=4096)] | None = None
    kv_index_blocks: Annotated[int, Field(ge=1, le=100_000_000)] = 262_144
    # ``score``: a request naming a session (``x-session-id`` header, else the ``user`` field) stays
    # on the server that served its session last while that server is within the load bound.
    session_affinity: bool = True
    sessions: Annotated[int, Field(ge=1, le=10_000_000)] = 65_536
    # Seconds between scrapes of each worker's ``/metrics`` (queue length, KV cache usage).
    metrics_interval: Annotated[float, Field(gt=0, le=3600)] = 0.1
    # Tries of one request across workers (a crashed worker's request goes to another).
    max_attempts: Annotated[int, Field(ge=1, le=16)] = 3
    # Seconds a request waits for a ready worker before its 503 (with Retry-After).
    wait_for_ready: Annotated[float, Field(ge=0, le=3600)] = 30.0


class PoolProbeConfig(_Strict):
    """Each worker's ``GET /health``: a worker failing ``failures`` probes in a row is replaced."""

    interval: Annotated[float, Field(gt=0, le=3600)] = 2.0
    timeout: Annotated[float, Field(gt=0, le=600)] = 2.0
    failures: Annotated[int, Field(ge=1, le=1000)] = 3


class DNSDiscoveryConfig(_Strict):
    """Endpoints from a DNS name's A/AAAA records (e.g. a Kubernetes headless Service)."""

    dns: Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$")]
    port: Annotated[int, Field(ge=1, le=65535)] = 8000
    scheme: Literal["http", "https"] = "http"
    path: Annotated[str, Field(pattern=r"^/[A-Za-z0-9._~/-]*$")] = "/v1"
    # Seconds between re-resolutions.
    interval: Annotated[float, Field(gt=0, le=86400)] = 10.0


class PoolRestartConfig(_Strict):
    """Restarts of a crashed or hung worker: exponential backoff, then give up."""

    backoff_initial: Annotated[float, Field(ge=0, le=3600)] = 1.0
    backoff_max: Annotated[float, Field(ge=0, le=3600)] = 60.0
    # Failures in a row (crash, failed start, health lost) after which the worker is marked
    # failed and left stopped; a worker that stayed ready ``reset_after`` seconds starts over.
    max_failures: Annotated[int, Field(ge=1, le=1000)] = 5
    reset_after: Annotated[float, Field(ge=0)] = 300.0


# Flags of ``vllm serve`` the pool sets itself, per worker.
_POOL_OWNED_FLAGS = ("--host", "--port", "--tensor-parallel-size", "-tp", "--served-model-name", "--model")
# vLLM tasks and conversions that make a pooling model (no generation).
_POOLING_TASKS = frozenset({"embed", "embedding", "score", "classify", "reward", "rerank"})


class VLLMPoolBackendConfig(_BackendBase):
    """vLLM workers the gateway starts, supervises and routes across (``backends.vllm.pool``)."""

    type: Literal["vllm-pool"]
    # Path or model id, passed to ``vllm serve``.
    model: Annotated[str, Field(min_length=1)]
    # The id workers list in /v1/models and routes must name (default: ``model``).
    served_model_name: Annotated[str, Field(min_length=1)] | None = None
    # GPU ids, ``all`` (what nvidia-smi lists) or a count (GPUs 0..n-1); [] = CPU workers.
    gpus: list[int] | Literal["all"] | int = Field(default_factory=list)
    tensor_parallel_size: Annotated[int, Field(ge=1, le=1024)] = 1
    # Number of workers; default: GPUs // tensor_parallel_size (1 without GPUs).
    workers: Annotated[int, Field(ge=1, le=1024)] | None = None
    host: str = "127.0.0.1"
    port_range: tuple[Annotated[int, Field(ge=1, le=65535)], Annotated[int, Field(ge=1, le=65535)]] = (8100, 8199)
    vllm_args: list[str] = Field(default_factory=list)
    env: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], str] = Field(default_factory=dict)
    # The worker program; the pool appends ``MODEL --host H --port P --tensor-parallel-size N``
    # (and ``--served-model-name``), then ``vllm_args``.
    command: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] = Field(
        default_factory=lambda: ["vllm", "serve"]
    )
    # Seconds from spawn to ready (/health answers and /v1/models lists the model).
    startup_timeout: Annotated[float, Field(gt=0)] = 900.0
    # Seconds between SIGTERM and SIGKILL when a worker is stopped.
    stop_timeout: Annotated[float, Field(gt=0, le=3600)] = 30.0
    # Per-worker log files and the pool's status.json (``gateway pool status`` reads it);
    # default: <tmp>/completions-gateway-<uid>/<backend name>.
    log_dir: str | None = None
    probe: PoolProbeConfig = Field(default_factory=PoolProbeConfig)
    restart: PoolRestartConfig = Field(default_factory=PoolRestartConfig)
    routing: PoolRoutingConfig = Field(default_factory=PoolRoutingConfig)
    # Towards each worker, as for a ``vllm`` backend.
    timeout: TimeoutConfig = Field(default_factory=TimeoutConfig)
    max_connections: Annotated[int, Field(ge=1, le=100_000)] = 1024
    transport: Literal["httptools", "aiohttp", "httpx"] = "httptools"
    limits: UpstreamLimitsConfig = Field(default_factory=UpstreamLimitsConfig)
    stream_usage: bool = True

    @property
    def served_name(self) -> str:
        return self.served_model_name or self.model

    def vllm_arg(self, flag: str) -> str | None:
        """The value ``vllm_args`` give ``flag`` (``--flag V`` or ``--flag=V``; the last wins), or None."""
        args = self.vllm_args
        value = None
        for i, arg in enumerate(args):
            if arg == flag and i + 1 < len(args):
                value = args[i + 1]
            elif arg.startswith(flag + "="):
                value = arg.split("=", 1)[1]
        return value

    @property
    def tool_parser(self) -> str | None:
        """The tool-call parser the workers run: ``--tool-call-parser X`` with ``--enable-auto-tool-choice``.

        Both flags, as ``vllm serve`` needs both for ``tool_choice: auto``; without them the
        pool's chat table treats the workers as running no parser.
        """
        if "--enable-auto-tool-choice" not in self.vllm_args:
            return None
        return self.vllm_arg("--tool-call-parser") or None

    @property
    def pooling(self) -> bool:
        """Whether the workers run a pooling model (``--runner pooling``, ``--convert embed``, or the
        older ``--task embed``/``score``): they serve embeddings and rerank, not completions or chat."""
        args = self.vllm_args
        for i, arg in enumerate(args):
            flag, _, value = arg.partition("=")
            if not value and i + 1 < len(args):
                value = args[i + 1]
            if (flag == "--runner" and value == "pooling") or (
                flag in ("--convert", "--task") and value in _POOLING_TASKS
            ):
                return True
        return False

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpus_shape(cls, value: object) -> object:
        # Checked here, whole, for one clear message instead of one per member of the union.
        if value == "all" or (type(value) is int and 1 <= value <= 1024):
            return value
        if isinstance(value, list) and all(type(g) is int and 0 <= g <= 1023 for g in value):
            return value
        raise ValueError(f"gpus must be a list of GPU ids (0-1023), 'all', or a count (1-1024); got {value!r}")

    @field_validator("vllm_args")
    @classmethod
    def _no_pool_owned_flags(cls, value: list[str]) -> list[str]:
        for arg in value:
            flag = arg.split("=", 1)[0]
            if flag in _POOL_OWNED_FLAGS:
                raise ValueError(f"{flag} is set by the pool per worker; use the pool's own keys")
        return value

    @model_validator(mode="after")
    def _worker_plan(self) -> VLLMPoolBackendConfig:
        lo, hi = self.port_range
        if lo > hi:
            raise ValueError(f"port_range [{lo}, {hi}] is empty")
        tp = self.tensor_parallel_size
        gpus = self.gpus
        if isinstance(gpus, list):
            if len(set(gpus)) != len(gpus):
                raise ValueError("gpus lists a GPU twice")
            if gpus and len(gpus) % tp:
                raise ValueError(f"{len(gpus)} GPUs in gpus cannot be split into workers of tensor_parallel_size {tp}")
        count = gpus if isinstance(gpus, int) else len(gpus) if isinstance(gpus, list) else None
        if count is not None and count and self.workers is not None and self.workers * tp > count:
            raise ValueError(f"{self.workers} workers of {tp} GPUs need more than the {count} GPUs in gpus")
        if gpus and "CUDA_VISIBLE_DEVICES" in self.env:
            raise ValueError("CUDA_VISIBLE_DEVICES in env is set by the pool per worker (from gpus)")
        routing = self.routing
        if routing.kv_events is not None:
            raise ValueError("routing.kv_events is for remote vllm servers; a vllm-pool sets its workers' own")
        if routing.strategy == "score" and routing.prefix == "kv-events":
            if any(arg.split("=", 1)[0] == "--kv-events-config" for arg in self.vllm_args):
                raise ValueError("--kv-events-config is set by the pool per worker (routing: score, prefix: kv-events)")
        planned = self.workers or (count // tp if count else 1 if count is not None else 0)
        if planned > hi - lo + 1:
            raise ValueError(f"port_range holds {hi - lo + 1} port(s) for {planned} workers")
        return self
