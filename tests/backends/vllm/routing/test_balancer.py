"""Worker choice without processes: prefix keys, the bounded LRU, load and affinity, scraping."""

from __future__ import annotations

from typing import Any

import pytest

from backends.vllm.routing.balancer import Balancer, Endpoint
from backends.vllm.routing.prefix import PrefixLRU, prefix_keys
from backends.vllm.routing.scrape import WorkerLoad, parse_vllm_metrics
from schemas.completions import CompletionRequest
from schemas.config import PoolRoutingConfig

ROUTING = PoolRoutingConfig(
    strategy="prefix-affinity", block_chars=16, block_tokens=4, max_blocks=4, affinity_entries=8
)


def keys(prompt: Any, routing: PoolRoutingConfig = ROUTING) -> tuple[int, ...]:
    return prefix_keys(CompletionRequest.model_validate({"model": "m", "prompt": prompt}), routing)


def balancer(n: int, **routing: Any) -> Balancer:
    b = Balancer(ROUTING.model_copy(update=routing))
    for i in range(n):
        ep = Endpoint(i, ROUTING.affinity_entries, f"http://w{i}")
        ep.available = True
        b.endpoints.append(ep)
    return b


# --- prefix keys ----------------------------------------------------------------------------


def test_keys_are_chained_over_whole_blocks_only() -> None:
    a = keys("A" * 16 + "B" * 16 + "C" * 10)
    assert len(a) == 2  # the partial third block does not count
    b = keys("A" * 16 + "X" * 16)
    assert a[0] == b[0] and a[1] != b[1]  # same first block, different second
    c = keys("X" * 16 + "B" * 16)
    assert c[1] != a[1]  # chained: block 2 alone does not make a match
    assert keys("short") == ()
    assert len(keys("A" * 1000)) == ROUTING.max_blocks


def test_keys_of_batches_and_token_prompts() -> None:
    assert keys(["A" * 32, "Z" * 32]) == keys("A" * 32)  # the first prompt of a batch
    tokens = keys([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert len(tokens) == 2 and tokens == keys([[1, 2, 3, 4, 5, 6, 7, 8], [7]])
    assert keys([1, 2, 3]) == ()


def test_lru_is_bounded_and_evicts_the_least_recent() -> None:
    lru = PrefixLRU(3)
    lru.add([1, 2, 3])
    lru.add([1])  # refresh 1
    lru.add([4])  # evicts 2
    assert (1 in lru, 2 in lru, 3 in lru, 4 in lru) == (True, False, True, True)
    lru.add(range(100, 1100))
    assert len(lru) == 3 and 1099 in lru


# --- load -----------------------------------------------------------------------------------


def test_least_load_uses_in_flight_then_queue_then_kv_and_spreads_ties() -> None:
    b = balancer(3, strategy="least-load")
    assert [b.pick((), set()).index for _ in range(3)] == [0, 1, 2]  # type: ignore[union-attr]
    b.endpoints[0].in_flight = 2
    b.endpoints[1].load = WorkerLoad(waiting=3)
    assert b.pick((), set()).index == 2  # type: ignore[union-attr]
    b.endpoints[2].in_flight = 2
    b.endpoints[0].load = WorkerLoad(kv_cache_usage=0.9)
    b.endpoints[2].load = WorkerLoad(kv_cache_usage=0.2)
    # scores: 2.9, 3.0, 2.2
    assert b.pick((), set()).index == 2  # type: ignore[union-attr]


def test_only_available_untried_endpoints_are_picked() -> None:
    b = balancer(3)
    b.endpoints[0].available = False
    assert {b.pick((), {(1, 0)}).index for _ in range(4)} == {2}  # type: ignore[union-attr]
    assert b.pick((), {(1, 0), (2, 0)}) is None
    b.endpoints[1].generation = 1  # restarted: a new try for calls that failed on it
    assert b.pick((), {(1, 0), (2, 0)}).index == 1  # type: ignore[union-attr]


def test_round_robin_ignores_load() -> None:
    b = balancer(3, strategy="round-robin")
    b.endpoints[0].in_flight = 100
    assert [b.pick(keys("A" * 64), set()).index for _ in range(6)] == [0, 1, 2, 0, 1, 2]  # type: ignore[union-attr]
    assert b.decisions["round_robin"] == 6


# --- affinity -------------------------------------------------------------------------------


def test_affinity_follows_the_longest_shared_prefix() -> None:
    b = balancer(3)
    first = b.pick(keys("A" * 32), set())
    assert first is not None and b.decisions["affinity_miss"] == 1
    first.in_flight += 1  # still busy: without affinity the next request would go elsewhere
    assert b.pick(keys("A" * 32 + "tail"), set()) is first
    # A prompt sharing two blocks with what went to endpoint 2 beats one sharing one block.
    b.endpoints[2].prefixes.add(keys("A" * 16 + "Q" * 16))
    assert b.pick(keys("A" * 16 + "Q" * 16 + "R" * 16), set()).index == 2  # type: ignore[union-attr]
    assert b.decisions == {
        "affinity_hit": 2,
        "affinity_miss": 1,
        "affinity_overloaded": 0,
        "least_load": 0,
        "round_robin": 0,
    }


@pytest.mark.parametrize(
    ("in_flight", "kv", "expected"),
    [(4, 0.0, "affinity_hit"), (5, 0.0, "affinity_overloaded"), (0, 0.95, "affinity_overloaded")],
)
def test_overloaded_affine_endpoint_falls_back_to_load(in_flight: int, kv: float, expected: str) -> None:
    b = balancer(2, overload_margin=4.0, kv_cache_high=0.95)
    affine = b.endpoints[0]
    affine.prefixes.add(keys("A" * 64))
    affine.in_flight = in_flight
    affine.load = WorkerLoad(kv_cache_usage=kv)
    chosen = b.pick(keys("A" * 64), set())
    assert b.decisions[expected] == 1
    assert chosen is (affine if expected == "affinity_hit" else b.endpoints[1])
    assert chosen is not None and keys("A" * 64)[-1] in chosen.prefixes  # the chosen one learns the prefix


def test_short_prompts_go_by_load() -> None:
    b = balancer(2)
    b.endpoints[0].in_flight = 1
    assert b.pick(keys("hi"), set()).index == 1  # type: ignore[union-attr]
    assert b.decisions["least_load"] == 1


# --- scraping -------------------------------------------------------------------------------


def test_parse_vllm_metrics() -> None:
    text = """# HELP vllm:num_requests_waiting Number of requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="1",model_name="m"} 2.0
vllm:num_requests_running{engine="0",model_name="m"} 4.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5 1700000000000
vllm:num_requests_waiting_by_reason{reason="x"} 99
vllm:num_requests_running{engine="2"} NaN
vllm:num_requests_running{engine="3"} garbage
"""
    assert parse_vllm_metrics(text) == WorkerLoad(waiting=5.0, running=4.0, kv_cache_usage=0.5, stale=False)
    # vLLM before 0.10 called it gpu_cache_usage_perc
    assert parse_vllm_metrics("vllm:gpu_cache_usage_perc 0.75\n").kv_cache_usage == 0.75
    assert parse_vllm_metrics("") == WorkerLoad(stale=False)
