"""End to end: the official ``openai`` client -> the gateway -> respx-mocked TGI, Ollama and llama.cpp.

For every field of the request schema and every native backend type the capability table
says what must happen, and :func:`test_every_field_through_the_gateway` checks exactly that:

- ``translated``: the field reaches the upstream in its native form (:data:`CASES` names where);
- ``emulated``: the gateway does it (several upstream calls, text put back or cut, a usage
  chunk, ``user`` recorded in the audit line, ...) and the client sees OpenAI's behaviour;
- ``unsupported``: 400 ``unsupported_parameter`` naming the field and the backend, and no
  upstream call; the field's neutral value passes.

:func:`test_cases_match_the_capability_tables` keeps :data:`CASES` and the tables (and so
the README matrix rendered from them) in step.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import orjson
import pytest
import pytest_asyncio
import respx

from backends.capabilities import ALL_FIELDS, AUDIT_USER_NOTE, Level
from backends.native.common import NativeCapabilities
from backends.native.llamacpp_capabilities import LLAMACPP_CAPABILITIES
from backends.native.ollama_capabilities import OLLAMA_CAPABILITIES
from backends.native.tgi_capabilities import TGI_CAPABILITIES
from gateway.app import create_app
from gateway.configfile import parse_config
from schemas.completions import NEUTRAL_VALUES
from tests.backends.native.helpers import (
    GOLDEN_CHOICE,
    GOLDEN_USAGE,
    KINDS,
    STREAM_PATH,
    UPSTREAM_MODEL,
    URLS,
    golden_complete,
    golden_stream,
)
from tests.conftest import serve_app

TABLES: dict[str, NativeCapabilities] = {
    "tgi": TGI_CAPABILITIES,
    "ollama": OLLAMA_CAPABILITIES,
    "llamacpp": LLAMACPP_CAPABILITIES,
}
PROMPT = "The capital of France is"
Sent = list[dict[str, Any]]  # the native bodies the upstream received, in order
Check = Callable[[Any, Sent], None]


def model_of(kind: str) -> str:
    return f"{kind}-model"


def _backends_yaml() -> str:
    return "".join(
        f"  - name: {kind}-a\n    type: {kind}\n    base_url: {URLS[kind]}\n    transport: httpx\n" for kind in KINDS
    )


def _models_yaml() -> str:
    return "".join(
        f"  - name: {model_of(kind)}\n    routes: [{{backend: {kind}-a, model: {UPSTREAM_MODEL[kind]}}}]\n"
        for kind in KINDS
    )


class AuditLines(logging.Handler):
    """Every audit line the module's gateway wrote (its audit log is on)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(orjson.loads(record.getMessage()))


AUDIT = AuditLines()


class Upstreams:
    """respx routes for the three native servers; answers from the golden payloads by default."""

    def __init__(self, mock: respx.MockRouter) -> None:
        self.mock = mock
        self.sent: dict[str, Sent] = {kind: [] for kind in KINDS}
        self.answer: dict[str, Callable[[dict[str, Any], bool], httpx.Response]] = {}
        for kind in KINDS:
            mock.route(host=httpx.URL(URLS[kind]).host).mock(side_effect=self._responder(kind))

    def reset(self) -> None:
        self.answer.clear()
        for sent in self.sent.values():
            sent.clear()

    def _responder(self, kind: str) -> Callable[[httpx.Request], httpx.Response]:
        def respond(request: httpx.Request) -> httpx.Response:
            body = orjson.loads(request.content)
            self.sent[kind].append(body)
            streaming = request.url.path == STREAM_PATH[kind] if kind == "tgi" else bool(body.get("stream"))
            custom = self.answer.get(kind)
            if custom is not None:
                return custom(body, streaming)
            return golden_stream(kind) if streaming else golden_complete(kind)

        return respond


# One gateway, one respx router and one client for the whole module (building a gateway
# with three httpx-backed backends costs about a second); each test starts from clean routes.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False, assert_all_mocked=True) as router:
        router.route(host="127.0.0.1").pass_through()  # the client's calls to the gateway itself
        yield router


@pytest.fixture(scope="module")
def routes(mock: respx.MockRouter) -> Upstreams:
    return Upstreams(mock)


@pytest.fixture
def upstreams(routes: Upstreams) -> Upstreams:
    routes.reset()
    return routes


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def native_gateway() -> AsyncIterator[str]:
    text = (
        "server: {host: 127.0.0.1, port: 0, audit_log: true}\nbackends:\n"
        + _backends_yaml()
        + "  - name: sim\n    type: mock\nmodels:\n"
        + _models_yaml()
    )
    logger = logging.getLogger("gateway.audit")
    logger.addHandler(AUDIT)
    runner, url = await serve_app(create_app(parse_config(text, "<test config>", env={})))
    try:
        yield url
    finally:
        await runner.cleanup()
        logger.removeHandler(AUDIT)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(native_gateway: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{native_gateway}/v1", api_key="x", max_retries=0, timeout=20) as c:
        yield c


# --- what each field must do ---------------------------------------------------------------------------


def at(body: dict[str, Any], kind: str, native: str) -> Any:
    """A native field: TGI's live under ``parameters``, Ollama's sampling ones under ``options``."""
    if kind == "tgi":
        return body["parameters"].get(native)
    if kind == "ollama" and native not in body:
        return body["options"].get(native)
    return body.get(native)


def sends(**natives: Any) -> Check:
    """Translated: every upstream body carries ``natives[kind]`` = (native field, value)."""

    def check(kind: str) -> Check:
        name, value = natives[kind]

        def inner(resp: Any, sent: Sent) -> None:
            assert sent and all(at(body, kind, name) == value for body in sent), (name, sent)

        return inner

    return check  # type: ignore[return-value]


@dataclass
class Case:
    extra: dict[str, Any]  # the request fields (the field under test, plus what it needs)
    checks: dict[str, Callable[[str], Check]] = field(default_factory=dict)  # kind -> check factory
    stream: bool = False


def _same(check: Callable[[str], Check], *kinds: str) -> dict[str, Callable[[str], Check]]:
    return dict.fromkeys(kinds, check)


def expect(fn: Callable[[str, Any, Sent], None]) -> Callable[[str], Check]:
    return lambda kind: lambda resp, sent: fn(kind, resp, sent)


@expect
def _model(kind: str, resp: Any, sent: Sent) -> None:
    assert resp.model == model_of(kind)
    if kind == "ollama":
        assert sent[0]["model"] == UPSTREAM_MODEL[kind]


@expect
def _prompt(kind: str, resp: Any, sent: Sent) -> None:
    assert (sent[0]["inputs"] if kind == "tgi" else sent[0]["prompt"]) == PROMPT
    assert resp.choices[0].text == " Paris"


@expect
def _batch_and_n(kind: str, resp: Any, sent: Sent) -> None:
    assert len(sent) == 4  # 2 prompts x n=2
    assert [c.index for c in resp.choices] == [0, 1, 2, 3]
    prompts = [b["inputs"] if kind == "tgi" else b["prompt"] for b in sent]
    assert sorted(prompts) == ["A", "A", "B", "B"]
    assert resp.usage.completion_tokens == 8 and resp.usage.prompt_tokens == 12  # prompts counted once each


@expect
def _n(kind: str, resp: Any, sent: Sent) -> None:
    assert len(sent) == 3 and [c.index for c in resp.choices] == [0, 1, 2]
    seeds = sorted(at(body, kind, "seed") for body in sent)
    assert seeds == [5, 6, 7]  # distinct seeds: the client's, then the next ones
    assert resp.usage.completion_tokens == 6


@expect
def _best_of(kind: str, resp: Any, sent: Sent) -> None:
    assert len(sent) == 3 and len(resp.choices) == 1
    assert resp.choices[0].text == " best!"  # the candidate with the highest mean token logprob
    assert resp.choices[0].logprobs is None  # the client did not ask for them
    assert resp.usage.completion_tokens == 6  # every candidate is billed


@expect
def _echo(kind: str, resp: Any, sent: Sent) -> None:
    assert resp.choices[0].text == PROMPT + " Paris"


@expect
def _logprobs(kind: str, resp: Any, sent: Sent) -> None:
    assert resp.choices[0].logprobs.model_dump() == GOLDEN_CHOICE["logprobs"]
    body = sent[0]
    if kind == "tgi":
        assert body["parameters"]["top_n_tokens"] == 2
    elif kind == "ollama":
        assert body["logprobs"] is True and body["top_logprobs"] == 2
    else:
        assert body["n_probs"] == 2


@expect
def _stop(kind: str, resp: Any, sent: Sent) -> None:
    assert at(sent[0], kind, "stop") == ["."]
    assert resp.choices[0].text == " Paris" and resp.choices[0].finish_reason == "stop"


@expect
def _include_stop(kind: str, resp: Any, sent: Sent) -> None:
    assert resp.choices[0].text == " Paris."


@expect
def _stream(kind: str, chunks: Any, sent: Sent) -> None:
    assert "".join(c.choices[0].text for c in chunks if c.choices) == " Paris"
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(c.usage is None for c in chunks)


@expect
def _stream_usage(kind: str, chunks: Any, sent: Sent) -> None:
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump(exclude_none=True) == GOLDEN_USAGE
    assert all(c.usage is None for c in chunks[:-1])


@expect
def _user(kind: str, resp: Any, sent: Sent) -> None:
    # No native server has an end-user field: the gateway honours it in the request's audit line
    # (written before the answer leaves), and the table says so.
    assert b"client-7" not in orjson.dumps(sent[0])
    assert any(line["user"] == "client-7" and line["model"] == model_of(kind) for line in AUDIT.lines), AUDIT.lines
    assert TABLES[kind].level("user") is Level.EMULATED and TABLES[kind].notes["user"] == AUDIT_USER_NOTE


@expect
def _temperature_zero_tgi(kind: str, resp: Any, sent: Sent) -> None:
    assert sent[0]["parameters"]["do_sample"] is False and "temperature" not in sent[0]["parameters"]


@expect
def _max_tokens(kind: str, resp: Any, sent: Sent) -> None:
    name = {"tgi": "max_new_tokens", "ollama": "num_predict", "llamacpp": "n_predict"}[kind]
    assert at(sent[0], kind, name) == 5


SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}
CASES: dict[str, Case] = {
    "model": Case({}, _same(_model, *KINDS)),
    "prompt": Case({}, _same(_prompt, *KINDS)),
    "best_of": Case({"best_of": 3}, _same(_best_of, *KINDS)),
    "echo": Case({"echo": True}, _same(_echo, *KINDS)),
    "frequency_penalty": Case(
        {"frequency_penalty": 0.5},
        {
            "tgi": sends(tgi=("frequency_penalty", 0.5)),
            "ollama": sends(ollama=("frequency_penalty", 0.5)),
            "llamacpp": sends(llamacpp=("frequency_penalty", 0.5)),
        },
    ),
    "logit_bias": Case({"logit_bias": {"15": -100}}, {"llamacpp": sends(llamacpp=("logit_bias", [[15, -100]]))}),
    "logprobs": Case({"logprobs": 2}, _same(_logprobs, *KINDS)),
    "max_tokens": Case({"max_tokens": 5}, _same(_max_tokens, *KINDS)),
    "n": Case({"n": 3, "seed": 5}, _same(_n, *KINDS)),
    "presence_penalty": Case(
        {"presence_penalty": 0.5},
        {"ollama": sends(ollama=("presence_penalty", 0.5)), "llamacpp": sends(llamacpp=("presence_penalty", 0.5))},
    ),
    "seed": Case(
        {"seed": 7},
        {"tgi": sends(tgi=("seed", 7)), "ollama": sends(ollama=("seed", 7)), "llamacpp": sends(llamacpp=("seed", 7))},
    ),
    "stop": Case({"stop": "."}, _same(_stop, *KINDS)),
    "stream": Case({"stream": True}, _same(_stream, *KINDS), stream=True),
    "stream_options": Case(
        {"stream": True, "stream_options": {"include_usage": True}}, _same(_stream_usage, *KINDS), stream=True
    ),
    "suffix": Case({"suffix": "!"}, {"ollama": sends(ollama=("suffix", "!"))}),
    "temperature": Case(
        {"temperature": 0.0},
        {
            "tgi": _temperature_zero_tgi,
            "ollama": sends(ollama=("temperature", 0.0)),
            "llamacpp": sends(llamacpp=("temperature", 0.0)),
        },
    ),
    "top_p": Case(
        {"top_p": 0.5},
        {
            "tgi": sends(tgi=("top_p", 0.5)),
            "ollama": sends(ollama=("top_p", 0.5)),
            "llamacpp": sends(llamacpp=("top_p", 0.5)),
        },
    ),
    "user": Case({"user": "client-7"}, _same(_user, *KINDS)),
    "top_k": Case(
        {"top_k": 5},
        {
            "tgi": sends(tgi=("top_k", 5)),
            "ollama": sends(ollama=("top_k", 5)),
            "llamacpp": sends(llamacpp=("top_k", 5)),
        },
    ),
    "min_p": Case({"min_p": 0.1}, {"ollama": sends(ollama=("min_p", 0.1)), "llamacpp": sends(llamacpp=("min_p", 0.1))}),
    "use_beam_search": Case({"use_beam_search": True}),
    "length_penalty": Case({"length_penalty": 0.5}),
    "repetition_penalty": Case(
        {"repetition_penalty": 1.2},
        {
            "tgi": sends(tgi=("repetition_penalty", 1.2)),
            "ollama": sends(ollama=("repeat_penalty", 1.2)),
            "llamacpp": sends(llamacpp=("repeat_penalty", 1.2)),
        },
    ),
    "early_stopping": Case({"early_stopping": True}),
    "stop_token_ids": Case({"stop_token_ids": [2]}),
    "include_stop_str_in_output": Case(
        {"stop": ".", "include_stop_str_in_output": True}, _same(_include_stop, "tgi", "llamacpp")
    ),
    "ignore_eos": Case({"ignore_eos": True}, {"llamacpp": sends(llamacpp=("ignore_eos", True))}),
    "min_tokens": Case({"min_tokens": 2}),
    "skip_special_tokens": Case({"skip_special_tokens": False}),
    "spaces_between_special_tokens": Case({"spaces_between_special_tokens": False}),
    "add_special_tokens": Case({"add_special_tokens": False}),
    "guided_json": Case(
        {"guided_json": SCHEMA},
        {
            "tgi": sends(tgi=("grammar", {"type": "json", "value": SCHEMA})),
            "ollama": sends(ollama=("format", SCHEMA)),
            "llamacpp": sends(llamacpp=("json_schema", SCHEMA)),
        },
    ),
    "guided_regex": Case(
        {"guided_regex": "[0-9]+"}, {"tgi": sends(tgi=("grammar", {"type": "regex", "value": "[0-9]+"}))}
    ),
    "guided_choice": Case(
        {"guided_choice": ["yes", "n.o"]},
        {
            "tgi": sends(tgi=("grammar", {"type": "regex", "value": "(yes|n\\.o)"})),
            "llamacpp": sends(llamacpp=("grammar", 'root ::= "yes" | "n.o"')),
        },
    ),
    "guided_grammar": Case(
        {"guided_grammar": 'root ::= "a"'}, {"llamacpp": sends(llamacpp=("grammar", 'root ::= "a"'))}
    ),
    "guided_decoding_backend": Case({"guided_json": SCHEMA, "guided_decoding_backend": "xgrammar"}),
    "guided_whitespace_pattern": Case({"guided_json": SCHEMA, "guided_whitespace_pattern": " "}),
    # Current vLLM's fields (issue 13 item 27): no native API has them, all refuse them by name.
    "truncate_prompt_tokens": Case({"truncate_prompt_tokens": 8}),
    "truncation_side": Case({"truncation_side": "left"}),
    "allowed_token_ids": Case({"allowed_token_ids": [1, 2]}),
    "prompt_logprobs": Case({"prompt_logprobs": 1}),
    "return_tokens_as_token_ids": Case({"return_tokens_as_token_ids": True}),
    "return_token_ids": Case({"return_token_ids": True}),
    "structured_outputs": Case({"structured_outputs": {"regex": "[0-9]+"}}),
    # vLLM's own fields chat takes too (schemas.vllm_extras): no native API has them.
    "bad_words": Case({"bad_words": ["Paris"]}),
    "logprob_token_ids": Case({"logprobs": 1, "logprob_token_ids": [5]}),
    "thinking_token_budget": Case({"thinking_token_budget": 8}),
    "watermarking": Case({"watermarking": True}),
    "priority": Case({"priority": 3}),
    "request_id": Case({"request_id": "rid-7"}),
    "session_id": Case({"session_id": "s-7"}),
    "routed_experts_prompt_start": Case({"routed_experts_prompt_start": 2}),
    "cache_salt": Case({"cache_salt": "salt-7"}),
    "kv_transfer_params": Case({"kv_transfer_params": {"do_remote_decode": True}}),
    "ec_transfer_params": Case({"ec_transfer_params": {"ec": 7}}),
    "vllm_xargs": Case({"vllm_xargs": {"k": 7}}),
    "repetition_detection": Case({"repetition_detection": {"max_pattern_size": 3, "min_count": 2}}),
    "stream_interval": Case({"stream": True, "stream_interval": 2}, stream=True),
    "stream_options.continuous_usage_stats": Case(
        {"stream": True, "stream_options": {"continuous_usage_stats": True}}, stream=True
    ),
    # vLLM's completions response_format: each native API's JSON constraint; prompt embeddings: none has them.
    "response_format": Case(
        {"response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}}},
        {
            "tgi": sends(tgi=("grammar", {"type": "json", "value": SCHEMA})),
            "ollama": sends(ollama=("format", SCHEMA)),
            "llamacpp": sends(llamacpp=("json_schema", SCHEMA)),
        },
    ),
    "prompt_embeds": Case({"prompt_embeds": "UEsDBA=="}),
}


@pytest.mark.filterwarnings("ignore::pytest.PytestWarning")  # a sync test under the module's asyncio mark
def test_cases_match_the_capability_tables() -> None:
    """Every field has a case; a backend has a check for it exactly when its table does not refuse it."""
    assert set(CASES) == set(ALL_FIELDS)
    for kind, table in TABLES.items():
        for name in ALL_FIELDS:
            refused = table.level(name) is Level.UNSUPPORTED
            assert refused == (kind not in CASES[name].checks), (kind, name, table.level(name))


def _ranked_answers(kind: str) -> Callable[[dict[str, Any], bool], httpx.Response]:
    """Three candidates with mean token logprobs -2, -0.5 (" best"), -1: whatever order they come in."""
    scores = {" worst": -2.0, " best": -0.5, " mid": -1.0}
    order = iter([" worst", " best", " mid"])

    def answer(body: dict[str, Any], streaming: bool) -> httpx.Response:
        text = next(order)
        lp = scores[text]
        if kind == "tgi":
            tokens = [
                {"id": 1, "text": text, "logprob": lp, "special": False},
                {"id": 2, "text": "!", "logprob": lp, "special": False},
            ]
            obj: dict[str, Any] = {
                "generated_text": text + "!",
                "details": {"finish_reason": "length", "generated_tokens": 2, "tokens": tokens},
            }
            return httpx.Response(200, json=obj, headers={"x-prompt-tokens": "6"})
        entries = [
            {"token": text, "logprob": lp, "top_logprobs": []},
            {"token": "!", "logprob": lp, "top_logprobs": []},
        ]
        if kind == "ollama":
            obj = {
                "response": text + "!",
                "done": True,
                "done_reason": "length",
                "prompt_eval_count": 6,
                "eval_count": 2,
                "logprobs": entries,
            }
        else:
            obj = {
                "content": text + "!",
                "stop": True,
                "stop_type": "limit",
                "tokens_evaluated": 6,
                "tokens_predicted": 2,
                "completion_probabilities": entries,
            }
        return httpx.Response(200, json=obj)

    return answer


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("kind", KINDS)
async def test_every_field_through_the_gateway(
    client: openai.AsyncOpenAI, upstreams: Upstreams, kind: str, name: str
) -> None:
    case = CASES[name]
    extra = dict(case.extra)
    if name == "best_of":
        upstreams.answer[kind] = _ranked_answers(kind)
    # The golden answers reply to a request with stop "." (TGI's keeps it in its text).
    request: dict[str, Any] = {"model": model_of(kind), "prompt": PROMPT, "stop": "."}
    request.update(
        {
            k: v
            for k, v in extra.items()
            if k
            in (
                "stream",
                "stream_options",
                "max_tokens",
                "n",
                "seed",
                "best_of",
                "echo",
                "logprobs",
                "stop",
                "suffix",
                "temperature",
                "top_p",
                "user",
                "frequency_penalty",
                "presence_penalty",
                "logit_bias",
            )
        }
    )
    vllm_extras = {k: v for k, v in extra.items() if k not in request}
    check = case.checks.get(kind)
    if check is None:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.completions.create(**request, extra_body=vllm_extras)
        body = caught.value.body
        assert isinstance(body, dict)
        assert body["code"] == "unsupported_parameter" and body["param"] == name
        assert f"'{kind}-a'" in body["message"]
        assert upstreams.sent[kind] == []
        # The neutral value of an unsupported field is no violation, and is not sent.
        for neutral in NEUTRAL_VALUES.get(name, ())[:1] if "." not in name else ():
            extras = {**vllm_extras, name: neutral} if name in vllm_extras else vllm_extras
            kwargs = {**request, name: neutral} if name in request else request
            await client.completions.create(**kwargs, extra_body=extras)
            assert name not in orjson.dumps(upstreams.sent[kind][-1]).decode()
        return
    if case.stream:
        stream = await client.completions.create(**request, extra_body=vllm_extras)
        result: Any = [chunk async for chunk in stream]
        assert all(c.model == model_of(kind) for c in result)
    else:
        result = await client.completions.create(**request, extra_body=vllm_extras)
        assert result.object == "text_completion" and result.id.startswith("cmpl-")
    check(kind)(result, upstreams.sent[kind])


@pytest.mark.parametrize("kind", KINDS)
async def test_prompt_batch_with_n_indexes_choices(client: openai.AsyncOpenAI, upstreams: Upstreams, kind: str) -> None:
    resp = await client.completions.create(model=model_of(kind), prompt=["A", "B"], n=2, max_tokens=8, stop=".")
    _batch_and_n(kind)(resp, upstreams.sent[kind])


@pytest.mark.parametrize("kind", KINDS)
async def test_streamed_fan_out_interleaves_indexed_chunks(
    client: openai.AsyncOpenAI, upstreams: Upstreams, kind: str
) -> None:
    stream = await client.completions.create(
        model=model_of(kind), prompt=["A", "B"], n=2, stream=True, stream_options={"include_usage": True}, stop="."
    )
    chunks = [chunk async for chunk in stream]
    usage = chunks[-1]
    assert usage.choices == [] and usage.usage is not None
    assert (usage.usage.prompt_tokens, usage.usage.completion_tokens) == (12, 8)
    by_index: dict[int, str] = {}
    finishes: dict[int, str | None] = {}
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        by_index[choice.index] = by_index.get(choice.index, "") + choice.text
        finishes[choice.index] = choice.finish_reason
    assert by_index == {0: " Paris", 1: " Paris", 2: " Paris", 3: " Paris"}
    assert set(finishes.values()) == {"stop"}
    assert len(upstreams.sent[kind]) == 4


@pytest.mark.parametrize("kind", KINDS)
async def test_greedy_n_is_one_upstream_call_replicated(
    client: openai.AsyncOpenAI, upstreams: Upstreams, kind: str
) -> None:
    resp = await client.completions.create(model=model_of(kind), prompt=PROMPT, n=3, temperature=0, stop=".")
    assert len(upstreams.sent[kind]) == 1
    assert [c.index for c in resp.choices] == [0, 1, 2] and {c.text for c in resp.choices} == {" Paris"}
    assert resp.usage is not None and resp.usage.completion_tokens == 6


REFUSED_BY_VALUE = [
    # kind, request, the field named
    ("tgi", {"prompt": [1, 2, 3]}, "prompt"),
    ("ollama", {"prompt": [[1, 2], [3]]}, "prompt"),
    ("tgi", {"echo": True, "logprobs": 1}, "echo"),
    ("ollama", {"echo": True, "logprobs": 0}, "echo"),
    ("llamacpp", {"echo": True, "logprobs": 1}, "echo"),
    (
        "llamacpp",
        {"stream": True, "stream_options": {"continuous_usage_stats": True}},
        "stream_options.continuous_usage_stats",
    ),
    # Issue 13 items 13/14/18: an empty (or null) prompt, refused by name where the server cannot serve it.
    ("ollama", {"prompt": ""}, "prompt"),
    ("ollama", {"prompt": None}, "prompt"),
    ("ollama", {"prompt": ["a", ""]}, "prompt"),
    ("tgi", {"prompt": ""}, "prompt"),
    ("tgi", {"prompt": None, "stream": True}, "prompt"),
    # Per-backend bounds (item 27): TGI's --max-top-n-tokens default, Ollama's top_logprobs maximum.
    ("tgi", {"logprobs": 6}, "logprobs"),
    ("ollama", {"logprobs": 21}, "logprobs"),
    ("tgi", {"prompt": ["a"] * 40, "stream": True}, "prompt"),
    ("ollama", {"n": 128, "prompt": ["a", "b", "c"]}, "n"),
    # A structural_tag response_format: no native API has structural tags (the JSON forms are translated).
    *[
        (kind, {"response_format": {"type": "structural_tag", "format": {"type": "any_text"}}}, "response_format")
        for kind in KINDS
    ],
]


@pytest.mark.parametrize(("kind", "fields", "param"), REFUSED_BY_VALUE)
async def test_refused_by_value(
    client: openai.AsyncOpenAI, upstreams: Upstreams, kind: str, fields: dict[str, Any], param: str
) -> None:
    request = {"model": model_of(kind), "prompt": PROMPT, **fields}
    for name in ("logprobs", "response_format"):  # a bound of the backend, a vLLM field: not an SDK argument
        if name in fields:
            request.setdefault("extra_body", {})[name] = request.pop(name)
    with pytest.raises(openai.BadRequestError) as caught:
        created = await client.completions.create(**request)
        if fields.get("stream"):
            async for _ in created:  # type: ignore[union-attr]
                pass
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == "unsupported_parameter" and body["param"] == param
    assert upstreams.sent[kind] == []


async def test_llamacpp_takes_token_prompts(client: openai.AsyncOpenAI, upstreams: Upstreams) -> None:
    resp = await client.completions.create(model=model_of("llamacpp"), prompt=[1, 2, 3], max_tokens=8, stop=".")
    assert resp.choices[0].text == " Paris"
    assert upstreams.sent["llamacpp"][0]["prompt"] == [1, 2, 3]


# A json_object response_format: any JSON object, in each native API's own form.
JSON_OBJECT = {"tgi": ("grammar", {"type": "json", "value": {"type": "object"}}), "ollama": ("format", "json"),
               "llamacpp": ("json_schema", {"type": "object"})}  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
async def test_json_object_response_format_is_translated(
    client: openai.AsyncOpenAI, upstreams: Upstreams, kind: str
) -> None:
    await client.completions.create(
        model=model_of(kind), prompt=PROMPT, stop=".", extra_body={"response_format": {"type": "json_object"}}
    )
    name, value = JSON_OBJECT[kind]
    [body] = upstreams.sent[kind]
    assert (body.get("parameters", body) if kind == "tgi" else body)[name] == value
    assert "response_format" not in body


@pytest.mark.parametrize("kind", KINDS)
async def test_native_error_reaches_the_client_in_our_envelope(
    client: openai.AsyncOpenAI, upstreams: Upstreams, kind: str
) -> None:
    upstreams.answer[kind] = lambda body, streaming: httpx.Response(
        422 if kind == "tgi" else 400,
        json={"error": "bad input"}
        if kind != "llamacpp"
        else {"error": {"code": 400, "message": "bad input", "type": "invalid_request_error"}},
    )
    with pytest.raises(openai.BadRequestError) as caught:
        await client.completions.create(model=model_of(kind), prompt=PROMPT)
    assert isinstance(caught.value.body, dict) and caught.value.body["message"] == "bad input"


@pytest.mark.parametrize("kind", KINDS)
async def test_mid_stream_error_becomes_an_error_event(native_gateway: str, upstreams: Upstreams, kind: str) -> None:
    from tests.backends.native.helpers import STREAM_ERROR, fixture, stream_response

    upstreams.answer[kind] = lambda body, streaming: stream_response(fixture(STREAM_ERROR[kind]), "text/event-stream")
    async with httpx.AsyncClient(timeout=20) as raw:
        resp = await raw.post(
            f"{native_gateway}/v1/completions", json={"model": model_of(kind), "prompt": PROMPT, "stream": True}
        )
    assert resp.status_code == 200
    events = [e for e in resp.content.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    error = orjson.loads(events[-2][len(b"data: ") :])
    assert error["error"]["code"] == "upstream_protocol_error" and "mid-stream" in error["error"]["message"]
    texts = [orjson.loads(e[6:])["choices"][0]["text"] for e in events[:-2]]
    assert texts == [" Paris"]
    assert all(b'"finish_reason":"' not in e for e in events[:-2])  # never an invented finish
