"""``prefix-hash`` routing and stable prefix keys, without processes (the balancer alone).

What must hold for replicas to agree without sharing state: the keys are the same in
every process, the endpoint order for a key depends only on the key and the endpoints'
URLs, a join or leave moves only the keys it must, and load spills past the bound only.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from backends.vllm.routing.balancer import DECISIONS, HASH_EPSILON, Balancer, Endpoint, rendezvous_order
from backends.vllm.routing.prefix import block_keys, prefix_keys
from backends.vllm.routing.scrape import WorkerLoad
from schemas.completions import CompletionRequest
from schemas.config import PoolRoutingConfig

ROOT = Path(__file__).resolve().parents[4]
ROUTING = PoolRoutingConfig(strategy="prefix-hash", block_chars=16, block_tokens=4, max_blocks=4)


def keys(prompt: Any) -> tuple[int, ...]:
    return prefix_keys(CompletionRequest.model_validate({"model": "m", "prompt": prompt}), ROUTING)


def balancer(urls: list[str], **routing: Any) -> Balancer:
    b = Balancer(ROUTING.model_copy(update=routing))
    for i, url in enumerate(urls):
        ep = Endpoint(i, 8, url)
        ep.available = True
        b.endpoints.append(ep)
    return b


URLS = [f"http://10.0.0.{i}:8000/v1" for i in range(1, 5)]


# --- stable keys ----------------------------------------------------------------------------


def test_keys_are_the_same_in_every_process() -> None:
    """Python's hash() is salted per process: two processes would disagree on every key."""
    prompts: list[Any] = ["A" * 40, [1, 2, 3, 4, 5, 6, 7, 8], [[9] * 8]]
    code = (
        "import json, sys\n"
        "from backends.vllm.routing.prefix import prefix_keys\n"
        "from schemas.completions import CompletionRequest\n"
        "from schemas.config import PoolRoutingConfig\n"
        "r = PoolRoutingConfig(block_chars=16, block_tokens=4, max_blocks=4)\n"
        "print(json.dumps([prefix_keys(CompletionRequest.model_validate({'model': 'm', 'prompt': p}), r)"
        " for p in json.loads(sys.argv[1])]))\n"
    )
    here = [list(keys(p)) for p in prompts]
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code, json.dumps(prompts)], cwd=ROOT, env=env, capture_output=True, check=True
        )
        assert json.loads(out.stdout) == here


def test_keys_are_pinned() -> None:
    """A change of the key scheme would split a fleet running two versions: make it deliberately."""
    assert keys("A" * 16) == (0x824601F3D808734C,)
    assert keys([1, 2, 3, 4]) == (0x96C1A3E13460C001,)


def test_the_key_function_takes_text_or_token_ids() -> None:
    assert block_keys("A" * 40, ROUTING) == keys("A" * 40) and len(keys("A" * 40)) == 2
    assert block_keys([1, 2, 3, 4, 5], ROUTING) == keys([1, 2, 3, 4, 5]) == keys([[1, 2, 3, 4, 5, 6]])
    assert block_keys(range(4), ROUTING) == block_keys((0, 1, 2, 3), ROUTING)  # any sequence of ids
    # Text and tokens never share a key; ids are not concatenated ambiguously (1,23 vs 12,3).
    assert block_keys("1,2,3,4," * 2, ROUTING) != block_keys([1, 2, 3, 4], ROUTING)
    assert block_keys([1, 23, 4, 5], ROUTING) != block_keys([12, 3, 4, 5], ROUTING)
    assert block_keys("\ud800" * 16, ROUTING)  # a lone surrogate hashes instead of raising
    assert block_keys([2**80] * 4, ROUTING)  # token ids are unbounded ints


# --- rendezvous -----------------------------------------------------------------------------


def test_replicas_with_endpoints_in_any_order_pick_the_same_one() -> None:
    a, b = balancer(URLS), balancer(list(reversed(URLS)))
    picks = set()
    for g in range(40):
        k = keys(f"group {g} ".ljust(16, "x") + "tail")
        pa, pb = a.pick(k, set()), b.pick(k, set())
        assert pa is not None and pb is not None and pa.url == pb.url
        picks.add(pa.url)
    assert picks == set(URLS)  # and the keys spread over every endpoint
    assert a.decisions["hash_preferred"] == 40 and a.decisions["hash_overloaded"] == 0


def test_a_join_or_leave_moves_only_its_share_of_keys() -> None:
    many = [f"http://10.0.1.{i}:8000/v1" for i in range(10)]
    eps = [Endpoint(i, 1, url) for i, url in enumerate(many)]
    sample = [k[0] for k in (keys(f"{n:016d}") for n in range(2000))]
    before = {k: rendezvous_order(eps, k)[0].url for k in sample}
    gone = eps[3]
    after_leave = {k: rendezvous_order([e for e in eps if e is not gone], k)[0].url for k in sample}
    moved = [k for k in sample if before[k] != after_leave[k]]
    assert all(before[k] == gone.url for k in moved)  # only the leaver's keys move
    assert 0.05 < len(moved) / len(sample) < 0.15  # ~1/10
    joiner = Endpoint(10, 1, "http://10.0.1.99:8000/v1")
    after_join = {k: rendezvous_order([*eps, joiner], k)[0].url for k in sample}
    moved = [k for k in sample if before[k] != after_join[k]]
    assert all(after_join[k] == joiner.url for k in moved)  # keys move only to the joiner
    assert 0.04 < len(moved) / len(sample) < 0.14  # ~1/11


def test_unavailable_and_already_tried_endpoints_are_skipped_in_rendezvous_order() -> None:
    b = balancer(URLS)
    k = keys("Z" * 16)
    order = rendezvous_order(b.endpoints, k[0])
    order[0].available = False
    assert b.pick(k, set()) is order[1]
    assert b.decisions["hash_preferred"] == 1  # the key's home among the live endpoints
    order[0].available = True
    assert b.pick(k, {order[0].ident}) is order[1]  # a retry goes to the next in line ...
    assert b.decisions["hash_overloaded"] == 1  # ... and counts as a spill
    assert b.pick(k, set()) is order[0]


# --- bounded load ---------------------------------------------------------------------------


def test_load_spills_to_the_next_endpoint_only_past_the_bound() -> None:
    b = balancer(URLS)
    k = keys("Q" * 16)
    order = rendezvous_order(b.endpoints, k[0])
    preferred = order[0]
    # 4 endpoints, the preferred one carrying all L requests: bound = ceil(1.25 * (L + 1) / 4).
    for load in range(0, 12):
        preferred.in_flight = load
        bound = math.ceil((1 + HASH_EPSILON) * (load + 1) / 4)
        expected = preferred if load + 1 <= bound else order[1]
        assert b.pick(k, set()) is expected, load
    preferred.in_flight = 0
    preferred.load = WorkerLoad(waiting=3)  # the server's own queue counts as load too
    order[1].in_flight = 2  # L = 5: bound ceil(1.25 * 6 / 4) = 2
    assert b.pick(k, set()) is order[2]


def test_no_endpoint_exceeds_the_bound_under_one_hot_prefix() -> None:
    b = balancer(URLS)
    k = keys("H" * 16)
    for total in range(200):  # requests arrive and stay in flight
        ep = b.pick(k, set())
        assert ep is not None
        ep.in_flight += 1
        assert ep.in_flight <= math.ceil((1 + HASH_EPSILON) * (total + 1) / 4)
    loads = sorted(e.in_flight for e in b.endpoints)
    assert loads[-1] <= math.ceil(1.25 * 200 / 4)


def test_a_full_kv_cache_is_passed_over() -> None:
    b = balancer(URLS, kv_cache_high=0.9)
    k = keys("K" * 16)
    order = rendezvous_order(b.endpoints, k[0])
    order[0].load = WorkerLoad(kv_cache_usage=0.95)
    assert b.pick(k, set()) is order[1]


def test_short_prompts_go_by_load_and_labels_are_per_strategy() -> None:
    b = balancer(URLS)
    b.endpoints[0].in_flight = 1
    assert b.pick(keys("hi"), set()) is not b.endpoints[0]
    assert b.decisions["least_load"] == 1
    assert list(b.decisions) == [d for d in DECISIONS if not d.startswith("score_")]
    assert list(balancer(URLS, strategy="score").decisions) == [d for d in DECISIONS if d.startswith("score_")]
    assert "hash_preferred" not in balancer(URLS, strategy="prefix-affinity").decisions


@pytest.mark.parametrize("strategy", ["prefix-hash", "prefix-affinity", "least-load", "round-robin"])
def test_strategy_is_a_config_value(strategy: str) -> None:
    assert PoolRoutingConfig.model_validate({"strategy": strategy}).strategy == strategy
