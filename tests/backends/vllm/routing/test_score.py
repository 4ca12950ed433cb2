"""``strategy: score`` without processes: the terms, the load bound, stale metrics, ties, sessions,
the decided-by counts; the KV-event index; the hasher's refusals; the product without the extra."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from backends.vllm.routing.balancer import Balancer, Endpoint
from backends.vllm.routing.blocks import BlockHasher, event_key, hasher_for
from backends.vllm.routing.dispatch import Dispatcher
from backends.vllm.routing.kv_events import BlockIndex, apply_batch
from backends.vllm.routing.rendezvous import rendezvous_first
from backends.vllm.routing.score import RoutedRequest, session_key
from backends.vllm.routing.scrape import WorkerLoad, parse_vllm_metrics
from backends.vllm.routing.signals import EngineSignals
from backends.vllm.routing.status import PoolStatus, format_table
from schemas.config import PoolRoutingConfig

URLS = [f"http://10.0.0.{i}:8000/v1" for i in range(1, 5)]
HASHER = hasher_for(4, "sha256", None)
assert isinstance(HASHER, BlockHasher)


def balancer(**routing: Any) -> Balancer:
    b = Balancer(PoolRoutingConfig(strategy="score", **routing))
    b.hasher = lambda ep: HASHER
    for i, url in enumerate(URLS):
        ep = Endpoint(i, 8, url, index_blocks=1000)
        ep.available = True
        ep.load = WorkerLoad(block_size=4, stale=False)
        b.endpoints.append(ep)
    return b


def request(tokens: list[int], session: str | None = None) -> RoutedRequest:
    return RoutedRequest((tokens[0] + 1,), tokens, session)


TOKENS = list(range(40))  # 10 blocks of 4


def test_the_server_holding_the_prompts_blocks_wins_by_prefix() -> None:
    b = balancer()
    holder = b.endpoints[2]
    holder.blocks.store(HASHER.keys(TOKENS, 100)[:8])  # 8 of the 10 blocks
    b.endpoints[0].blocks.store(HASHER.keys(TOKENS, 100)[:2])
    assert b.pick((), set(), request(TOKENS)) is holder
    assert b.decisions["score_prefix"] == 1 and holder.decided == {"score_prefix": 1}
    assert b.prefix_modes == {"kv_events": 1, "approximate": 0}


def test_a_holder_over_the_load_bound_is_passed_over() -> None:
    b = balancer(max_load_ratio=1.5)
    holder = b.endpoints[1]
    holder.blocks.store(HASHER.keys(TOKENS, 100))
    holder.load = WorkerLoad(waiting=6, running=2, block_size=4, stale=False)  # over 1.5 x the mean (2) + 1
    chosen = b.pick((), set(), request(TOKENS))
    assert chosen is not holder
    holder.load = WorkerLoad(waiting=1, block_size=4, stale=False)  # 1 <= 1.5 x 0.25 + 1: within
    assert b.pick((), set(), request(TOKENS)) is holder


def test_the_queue_counts_calls_sent_since_the_scrape() -> None:
    ep = Endpoint(0, 8, URLS[0])
    ep.load = WorkerLoad(waiting=2, running=3, in_flight=4, stale=False)
    ep.in_flight = 7  # three more sent since the scrape
    assert ep.queue() == 8
    ep.in_flight = 1  # three of the scraped ones ended (and nothing new)
    assert ep.queue() == 2
    ep.load = ep.load.failed()
    assert ep.queue() == 1  # stale: what the gateway knows


def test_a_server_with_stale_metrics_is_not_preferred_for_its_unknown_cache() -> None:
    b = balancer(weights={"queue": 0, "kv_cache": 2, "prefix": 0})
    for ep in b.endpoints:
        ep.load = WorkerLoad(kv_cache_usage=0.5, block_size=4, stale=False)
    b.endpoints[3].load = WorkerLoad(kv_cache_usage=0.0, block_size=4, stale=True)  # zero, but unknown
    b.endpoints[1].load = WorkerLoad(kv_cache_usage=0.2, block_size=4, stale=False)
    assert b.pick((), set(), request(TOKENS)) is b.endpoints[1]
    assert b.decisions["score_kv_cache"] == 1


def test_ties_go_to_the_rendezvous_choice_alike_in_every_process() -> None:
    picks = set()
    for _ in range(3):  # three "processes": fresh balancers, different round-robin positions
        b = balancer()
        b._rr = len(picks)
        ep = b.pick((), set(), request(TOKENS))
        assert ep is not None
        picks.add(ep.url)
    assert len(picks) == 1
    assert picks == {rendezvous_first(balancer().endpoints, TOKENS[0] + 1).url}


def test_a_session_stays_on_its_server_while_within_the_bound() -> None:
    b = balancer()
    home = rendezvous_first(b.endpoints, session_key("conv-1"))
    other = next(ep for ep in b.endpoints if ep is not home)
    other.blocks.store(HASHER.keys(TOKENS, 100))  # the prefix lives elsewhere: the session wins
    assert b.pick((), set(), request(TOKENS, "conv-1")) is home
    assert b.decisions["score_session"] == 1
    home.load = WorkerLoad(waiting=20, block_size=4, stale=False)  # overloaded: scored as usual
    assert b.pick((), set(), request(TOKENS, "conv-1")) is other


def test_without_a_hasher_the_prefix_is_the_rendezvous_choice() -> None:
    b = balancer()
    b.hasher = lambda ep: None  # block size unknown, or no tokenizer
    first = rendezvous_first(b.endpoints, 7)
    assert b.pick((7, 8), set(), RoutedRequest((7, 8), TOKENS)) is first
    assert b.prefix_modes["approximate"] == 1


def test_the_status_shows_the_inputs_and_the_deciding_terms() -> None:
    b = balancer()
    b.endpoints[0].blocks.store(HASHER.keys(TOKENS, 100))
    b.pick((), set(), request(TOKENS))
    from backends.vllm.routing.status import WorkerStatus, endpoint_fields

    workers = [WorkerStatus(index=ep.index, state="ready", **endpoint_fields(ep)) for ep in b.endpoints]
    status = PoolStatus("p", "vllm", workers, decisions=b.decisions, scoring={"prefix": "kv-events"})
    text = format_table(status)
    assert "blocks held" in text and "prefix:1" in text and "score_prefix 1" in text
    assert PoolStatus.from_json(status.to_json()).workers[0].prefix_blocks == 10


def test_cache_config_info_is_read() -> None:
    text = (
        'vllm:cache_config_info{block_size="32",cache_dtype="auto",enable_prefix_caching="True",'
        'num_gpu_blocks="1234",prefix_caching_hash_algo="sha256_cbor"} 1.0\n'
        'vllm:num_requests_running{engine="0"} 2.0\n'
    )
    load = parse_vllm_metrics(text, in_flight=5)
    assert (load.block_size, load.num_gpu_blocks, load.hash_algo, load.prefix_caching) == (
        32,
        1234,
        "sha256_cbor",
        True,
    )
    assert (load.running, load.in_flight, load.stale) == (2.0, 5, False)
    assert parse_vllm_metrics('vllm:cache_config_info{enable_prefix_caching="False"} 1\n').prefix_caching is False


def test_the_index_follows_the_events_and_stays_bounded() -> None:
    index = BlockIndex(capacity=3)
    stored = {"type": "BlockStored", "block_hashes": [1, 2, (3).to_bytes(32, "big")], "medium": "GPU"}
    apply_batch(index, 0, [0.0, [stored], None])
    assert index.run([1, 2, 3]) == 3
    apply_batch(index, 1, [0.0, [{"type": "BlockRemoved", "block_hashes": [2], "medium": "GPU"}], None])
    assert index.run([1, 2, 3]) == 1
    apply_batch(index, 2, [0.0, [{"type": "BlockStored", "block_hashes": [4, 5, 6], "medium": "CPU"}], None])
    assert len(index) == 2  # another tier's blocks are not on the server's GPU
    apply_batch(index, 5, [0.0, [{"type": "BlockStored", "block_hashes": [7, 8, 9], "medium": None}], None])
    assert index.gaps == 1 and len(index) == 3 and 1 not in index  # the oldest went
    apply_batch(index, 6, [0.0, [{"type": "AllBlocksCleared"}], None])
    assert len(index) == 0
    index.store([1])
    apply_batch(index, 0, [0.0, [], None])  # numbering starts again: a new publisher
    assert len(index) == 0
    assert event_key(2**70 + 9) == 9 and event_key(b"\x00" * 24 + (9).to_bytes(8, "big")) == 9
    assert event_key(True) is None and event_key("x") is None


def test_hashers_it_cannot_match_are_refused_by_name() -> None:
    assert "not known yet" in str(hasher_for(0, "sha256", None))
    assert "unknown" in str(hasher_for(16, "md5", None))
    assert "random seed" in str(hasher_for(16, "xxhash", None))
    seeded = hasher_for(16, "sha256", "0")
    assert isinstance(seeded, BlockHasher) and seeded.keys(list(range(16)), 9) != HASHER.keys(list(range(16)), 9)


def test_without_the_optional_libraries_the_prefix_is_approximate_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "zmq", None)  # import zmq raises ImportError
    routing = PoolRoutingConfig(strategy="score")
    dispatcher = Dispatcher("p", routing, on_failure=lambda ep, exc: None, hopeless=lambda: False, describe=str)
    signals = EngineSignals("p", dispatcher, tokenizer="/nowhere", seed=None, topic="", address=lambda ep: None)
    described = signals.describe()
    assert described["prefix"] == "approximate" and "zmq is not installed" in described["why"]
    assert dispatcher.tokenizer is None


def test_a_missing_tokenizer_is_said() -> None:
    routing = PoolRoutingConfig(strategy="score")
    dispatcher = Dispatcher("p", routing, on_failure=lambda ep, exc: None, hopeless=lambda: False, describe=str)
    signals = EngineSignals("p", dispatcher, tokenizer="/nowhere", seed=None, topic="", address=lambda ep: None)
    assert signals.describe()["why"] == "no tokenizer.json at /nowhere"


def test_a_responses_request_renders_as_the_same_conversation_in_chat() -> None:
    from types import SimpleNamespace

    from backends.vllm.routing.prefix import chat_prefix_text, items_prefix_text, request_keys
    from schemas.chat import ChatCompletionRequest

    system, user = "You answer in French. " * 20, "What is a gateway?"
    chat = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}
    )
    parts = [{"type": "input_text", "text": user}]
    responses = SimpleNamespace(instructions=system, input=[{"role": "user", "content": parts}])
    assert items_prefix_text(responses, 10_000) == chat_prefix_text(chat, 10_000)
    plain = SimpleNamespace(instructions=system, input=user)
    routing = PoolRoutingConfig(block_chars=64)
    assert request_keys(plain, routing) == request_keys(chat, routing) != ()
    assert request_keys(SimpleNamespace(), routing) == ()
    from schemas.responses import ResponsesRequest

    real = ResponsesRequest.model_validate(
        {"model": "m", "instructions": system, "input": [{"role": "user", "content": parts}]}
    )
    assert request_keys(real, routing) == request_keys(chat, routing)
