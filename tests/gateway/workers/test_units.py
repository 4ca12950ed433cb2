"""The pieces of ``--workers N`` that need no process: CPU count, cap split, config rule, metrics merge."""

from __future__ import annotations

import logging
from pathlib import Path

import orjson
import pytest

from gateway.flow import router
from gateway.metrics import GatewayMetrics
from gateway.workers.caps import overshoots, split_caps
from gateway.workers.cpus import available_cpus, cgroup_cpu_limit
from gateway.workers.merge import MetricsMerger, snapshot
from schemas.config import GatewayConfig, worker_problems
from schemas.endpoints import Endpoint


def _config(**extra: object) -> GatewayConfig:
    raw: dict[str, object] = {
        "server": {"admission": {"max_in_flight": 9, "queue_size": 5}},
        "backends": [
            {"name": "a", "type": "openai", "base_url": "http://127.0.0.1:1/v1", "max_concurrency": 3},
            {"name": "b", "type": "mock"},
        ],
        "models": [{"name": "m", "routes": [{"backend": "a", "model": "m"}]}],
    }
    return GatewayConfig.model_validate(raw | extra)


# --- auto --------------------------------------------------------------------------------------
def test_cgroup_v2_quota_of_own_group_and_parents(tmp_path: Path) -> None:
    (tmp_path / "kube/pod1").mkdir(parents=True)
    (tmp_path / "kube/cpu.max").write_text("300000 100000\n")
    (tmp_path / "kube/pod1/cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_limit(tmp_path, "0::/kube/pod1\n") == 1.5
    (tmp_path / "kube/pod1/cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit(tmp_path, "0::/kube/pod1\n") == 3.0  # the parent's quota still holds


def test_cgroup_v1_quota_and_unlimited(tmp_path: Path) -> None:
    group = tmp_path / "cpu,cpuacct/docker/c1"
    group.mkdir(parents=True)
    (group / "cpu.cfs_quota_us").write_text("200000")
    (group / "cpu.cfs_period_us").write_text("100000")
    assert cgroup_cpu_limit(tmp_path, "4:cpu,cpuacct:/docker/c1\n") == 2.0
    (group / "cpu.cfs_quota_us").write_text("-1")
    assert cgroup_cpu_limit(tmp_path, "4:cpu,cpuacct:/docker/c1\n") is None
    assert cgroup_cpu_limit(tmp_path, "") is None


def test_auto_is_the_affinity_mask_capped_by_the_quota(monkeypatch: pytest.MonkeyPatch) -> None:
    import gateway.workers.cpus as cpus

    monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda _: {0, 1, 2, 3, 4, 5, 6, 7})
    monkeypatch.setattr(cpus, "cgroup_cpu_limit", lambda: 2.5)
    assert available_cpus() == 3
    monkeypatch.setattr(cpus, "cgroup_cpu_limit", lambda: None)
    assert available_cpus() == 8
    monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda _: {3})
    assert available_cpus() == 1


# --- caps and config ---------------------------------------------------------------------------
def test_caps_split_so_the_shares_add_up_to_the_limit_and_unchanged_for_one() -> None:
    config = _config()
    assert split_caps(config, 1) is config
    first, second = split_caps(config, 2, 0), split_caps(config, 2, 1)
    assert (first.server.admission.max_in_flight, second.server.admission.max_in_flight) == (5, 4)  # 9 = 5 + 4
    assert first.server.admission.queue_size + second.server.admission.queue_size == config.server.admission.queue_size
    assert first.backends[0].max_concurrency + second.backends[0].max_concurrency == 3  # type: ignore[union-attr,operator]
    assert config.server.admission.max_in_flight == 9  # the original is untouched
    for n in (2, 3, 4, 7):
        shares = [split_caps(config, n, k) for k in range(n)]
        assert sum(s.server.admission.max_in_flight for s in shares) == 9
        assert sum(s.server.admission.queue_size for s in shares) == config.server.admission.queue_size
    assert overshoots(config, 2) == []


def test_a_cap_below_the_worker_count_gives_each_worker_one_and_is_named() -> None:
    config = _config()  # max_concurrency 3
    shares = [split_caps(config, 4, k).backends[0].max_concurrency for k in range(4)]  # type: ignore[union-attr]
    assert shares == [1, 1, 1, 1]  # a share of 0 could never serve
    assert overshoots(config, 4) == ["backends[0].max_concurrency (3)"]
    assert overshoots(config, 10) == ["server.admission.max_in_flight (9)", "backends[0].max_concurrency (3)"]


def test_per_key_limits_with_workers_need_redis_naming_the_keys() -> None:
    keys = [
        {"name": "alice", "key": "a" * 32, "rpm": 10},
        {"name": "bob", "key": "b" * 32},
        {"name": "carol", "key": "c" * 32, "tpm": 100, "max_concurrent": 2},
    ]
    config = _config(auth={"keys": keys})
    assert worker_problems(config, 1) == []
    problems = worker_problems(config, 4)
    assert len(problems) == 2
    assert problems[0].startswith("auth.keys[0] (alice): rpm with 4 workers need auth.store")
    assert problems[1].startswith("auth.keys[2] (carol): tpm, max_concurrent")
    shared = _config(auth={"keys": keys, "store": "redis://127.0.0.1:6379/0"})
    assert worker_problems(shared, 4) == []


def test_a_vllm_pool_is_servable_with_workers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The control process runs its supervisor once (gateway.workers.pools): no longer refused.
    pool = {"name": "p", "type": "vllm-pool", "model": "m", "command": ["vllm", "serve"], "workers": 2}
    config = _config(backends=[pool], models=[{"name": "m", "routes": [{"backend": "p", "model": "m"}]}])
    assert worker_problems(config, 4) == []
    from gateway.cli import main

    path = tmp_path / "gw.yaml"
    path.write_text(
        "backends: [{name: p, type: vllm-pool, model: m, command: [vllm, serve], workers: 2}]\n"
        "models: [{name: m, routes: [{backend: p, model: m}]}]\n"
    )
    assert main(["check-config", str(path), "--workers", "4"]) == 0
    out = capsys.readouterr().out
    assert "OK (1 backends, 1 models)" in out
    assert "p: its vLLM processes run once in the control process; the 4 workers route over them" in out


def test_cli_refuses_limits_with_workers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.cli import main

    path = tmp_path / "gw.yaml"
    path.write_text(
        "backends: [{name: b, type: mock}]\nmodels: [{name: m, routes: [{backend: b, model: m}]}]\n"
        f"auth: {{keys: [{{name: alice, key: {'k' * 32}, rpm: 5}}]}}\n"
    )
    assert main(["check-config", str(path)]) == 0
    assert main(["check-config", str(path), "--workers", "2"]) == 1
    assert "auth.keys[0] (alice): rpm with 2 workers" in capsys.readouterr().err
    assert main(["serve", "-c", str(path), "--workers", "2"]) == 1
    with pytest.raises(SystemExit):
        main(["serve", "-c", str(path), "--workers", "lots"])


# --- metrics merge -----------------------------------------------------------------------------
def _lines(text: bytes, prefix: str) -> list[str]:
    return [line for line in text.decode().splitlines() if line.startswith(prefix)]


def test_merge_sums_counters_and_histograms_and_keeps_gone_workers() -> None:
    a, b = GatewayMetrics(["m"], ["x"]), GatewayMetrics(["m"], ["x"])
    for each in (a, b):
        each.serve({"m": [Endpoint.COMPLETIONS, Endpoint.CHAT]})  # the router's: only those have series
    a.request_finished("m", "x", 200, 0.1)
    b.request_finished("m", "x", 200, 0.2)
    b.request_finished("m", "x", 500, 0.2)
    b.request_started("m")
    a.request_started("m")
    a.circuit_changed("x", 2)
    merger = MetricsMerger()
    merger.update(1, orjson.loads(orjson.dumps(snapshot(a.registry))))  # as it crosses the channel
    merger.update(2, orjson.loads(orjson.dumps(snapshot(b.registry))))
    text = merger.render()
    assert _lines(text, "gateway_requests_total") == [
        'gateway_requests_total{backend="x",endpoint="completions",model="m",status="200"} 2.0',
        'gateway_requests_total{backend="x",endpoint="completions",model="m",status="500"} 1.0',
    ]
    assert _lines(text, "gateway_request_duration_seconds_count") == [
        'gateway_request_duration_seconds_count{backend="x",endpoint="completions",model="m",status_class="2xx"} 2.0',
        'gateway_request_duration_seconds_count{backend="x",endpoint="completions",model="m",status_class="5xx"} 1.0',
    ]
    assert _lines(text, "gateway_requests_in_flight") == [
        'gateway_requests_in_flight{endpoint="completions",model="m"} 2.0',
        'gateway_requests_in_flight{endpoint="chat",model="m"} 0.0',  # served on two endpoints: two series
    ]
    assert _lines(text, "gateway_circuit_state") == ['gateway_circuit_state{backend="x"} 2.0']  # the worst
    assert text.count(b"# TYPE gateway_requests_total counter") == 1

    merger.retire(2)  # worker 2 died; a replacement starts from zero
    merger.update(3, snapshot(GatewayMetrics(["m"], ["x"]).registry))
    text = merger.render()
    assert 'gateway_requests_total{backend="x",endpoint="completions",model="m",status="500"} 1.0' in text.decode()
    assert 'gateway_requests_total{backend="x",endpoint="completions",model="m",status="200"} 2.0' in text.decode()
    assert _lines(text, "gateway_requests_in_flight") == [
        'gateway_requests_in_flight{endpoint="completions",model="m"} 1.0',
        'gateway_requests_in_flight{endpoint="chat",model="m"} 0.0',
    ]


def test_merge_counts_the_pools_published_figures_once() -> None:
    """Every worker reports the control process's pool state, restarts, queue and KV cache: one value, not N;
    its own calls in flight and routing decisions add up."""

    def worker(in_flight: int, restarts: int, decisions: int) -> list[list[object]]:
        labels = {"backend": "p", "worker": "0"}
        return [
            ["gateway_pool_worker_state", "gauge", "", [["gateway_pool_worker_state", labels | {"state": "ready"}, 1]]],
            ["gateway_pool_worker_restarts", "counter", "", [["gateway_pool_worker_restarts_total", labels, restarts]]],
            ["gateway_pool_worker_queue", "gauge", "", [["gateway_pool_worker_queue", labels, 3]]],
            ["gateway_pool_worker_in_flight", "gauge", "", [["gateway_pool_worker_in_flight", labels, in_flight]]],
            [
                "gateway_pool_routing_decisions",
                "counter",
                "",
                [["gateway_pool_routing_decisions_total", {"backend": "p", "decision": "least_load"}, decisions]],
            ],
        ]

    merger = MetricsMerger()
    merger.update(1, worker(2, 1, 10))
    merger.update(2, worker(3, 1, 5))
    text = merger.render()
    assert _lines(text, "gateway_pool_worker_state{") == [
        'gateway_pool_worker_state{backend="p",state="ready",worker="0"} 1.0'
    ]
    assert _lines(text, "gateway_pool_worker_restarts_total") == [
        'gateway_pool_worker_restarts_total{backend="p",worker="0"} 1.0'
    ]
    assert _lines(text, "gateway_pool_worker_queue{") == ['gateway_pool_worker_queue{backend="p",worker="0"} 3.0']
    assert _lines(text, "gateway_pool_worker_in_flight{") == [
        'gateway_pool_worker_in_flight{backend="p",worker="0"} 5.0'
    ]
    assert _lines(text, "gateway_pool_routing_decisions_total") == [
        'gateway_pool_routing_decisions_total{backend="p",decision="least_load"} 15.0'
    ]
    merger.retire(2)  # a replaced worker: the restarts stay one, its decisions stay counted
    merger.update(3, worker(0, 1, 0))
    text = merger.render()
    assert _lines(text, "gateway_pool_worker_restarts_total") == [
        'gateway_pool_worker_restarts_total{backend="p",worker="0"} 1.0'
    ]
    assert _lines(text, "gateway_pool_routing_decisions_total") == [
        'gateway_pool_routing_decisions_total{backend="p",decision="least_load"} 15.0'
    ]


# --- rotations ---------------------------------------------------------------------------------
def test_rotations_start_at_zero_unless_spread(monkeypatch: pytest.MonkeyPatch) -> None:
    assert router.RoundRobin()._next == 0
    monkeypatch.setattr(router, "_start", router._first)
    router.spread_starts()
    starts = {router.RoundRobin()._next for _ in range(20)}
    assert len(starts) > 1
    assert len({router.Weighted()._skip for _ in range(20)}) > 1


# --- Kubernetes --------------------------------------------------------------------------------
def test_k8s_sizes_workers_from_the_pods_cpu_request() -> None:
    import yaml

    root = Path(__file__).resolve().parents[3]
    deployment = yaml.safe_load((root / "deploy/k8s/base/gateway-deployment.yaml").read_text())
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    field = env["GATEWAY_WORKERS"]["valueFrom"]["resourceFieldRef"]
    assert field == {"containerName": container["name"], "resource": "requests.cpu", "divisor": "1"}
    assert "cpu" in container["resources"]["requests"]  # else the Downward API gives the node's CPUs


# --- reload with pools -------------------------------------------------------------------------
async def test_a_worker_refuses_a_reload_that_adds_a_pool(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A worker's SIGHUP would build the pool inside the worker: refused, naming it, old config serving
    (a changed pool section is taken: tests/gateway/workers/test_control_reload.py)."""
    from gateway.app import create_app
    from gateway.configfile import load_config
    from gateway.reload import enable_reload
    from gateway.state import STATE
    from gateway.workers.pools import same_pools

    base = "backends:\n  - {name: b, type: mock}\n"
    models = "models: [{name: m, routes: [{backend: b, model: m}]}]\n"
    path = tmp_path / "gw.yaml"
    path.write_text(base + models)
    started = load_config(path)
    app = create_app(started)
    reloader = enable_reload(app, path, adapt=lambda reloaded: same_pools(started, reloaded, str(path)))
    pool = "  - {name: p, type: vllm-pool, model: m, command: [/nonexistent/vllm], workers: 1}\n"
    path.write_text(base + pool + models)
    caplog.set_level(logging.ERROR, logger="gateway.reload")
    assert not await reloader.reload()
    errors = "\n".join(r.getMessage() for r in caplog.records)
    assert "backends[1]: vllm-pool backend 'p' is new" in errors and "restart the gateway" in errors
    assert set(app[STATE].backends) == {"b"}
    path.write_text(base + "  - {name: c, type: mock}\n" + models)  # anything else still reloads
    assert await reloader.reload()
    assert set(app[STATE].backends) == {"b", "c"}
    await app[STATE].backends["c"].close()
