"""The shared native pieces without I/O: stop cutting, legacy logprobs, choices, grammars, value rules."""

from __future__ import annotations

from typing import Any

import pytest

from backends.capabilities import Capabilities
from backends.errors import UpstreamProtocolError
from backends.mock.capabilities import MOCK_CAPABILITIES
from backends.native.chat import ChatPiece, ChatTurn
from backends.native.choice import ChoiceTracker, StopCutter, legacy_logprobs
from backends.native.common import TokenLogprob, fit_tokens, ollama_finish
from backends.native.llamacpp import choice_grammar
from backends.native.llamacpp_capabilities import LLAMACPP_CAPABILITIES
from backends.native.ollama_capabilities import OLLAMA_CAPABILITIES
from backends.native.tgi import choice_regex
from backends.native.tgi_capabilities import TGI_CAPABILITIES
from backends.openai.capabilities import OPENAI_CAPABILITIES
from backends.vllm.capabilities import VLLM_CAPABILITIES
from schemas.chat import ChatCompletionRequest
from schemas.completions import CompletionRequest


def req(**fields: Any) -> CompletionRequest:
    return CompletionRequest.model_validate({"model": "m", "prompt": "Hi", **fields})


def toks(*texts: str) -> list[TokenLogprob]:
    return [TokenLogprob(t, -float(i + 1)) for i, t in enumerate(texts)]


# --- StopCutter -------------------------------------------------------------------------------------


def test_stop_held_back_across_pieces_then_cut() -> None:
    cutter = StopCutter(["END"], keep=False)
    assert cutter.feed(" one E", None) == (" one ", None)  # "E" may start "END": held back
    assert cutter.feed("N", None) == ("", None)
    assert cutter.feed("D two", None) == ("", None)
    assert cutter.stopped
    assert cutter.feed(" more", None) == ("", None)


def test_false_alarm_is_released() -> None:
    cutter = StopCutter(["END"], keep=False)
    assert cutter.feed("a E", None) == ("a ", None)
    assert cutter.feed("x", None) == ("Ex", None)
    assert cutter.flush() == ("", [])


def test_flush_returns_what_was_held_at_the_end() -> None:
    cutter = StopCutter(["END"], keep=False)
    cutter.feed("a EN", None)
    assert cutter.flush() == ("EN", [])


def test_keep_includes_the_stop_sequence() -> None:
    cutter = StopCutter(["."], keep=True)
    assert cutter.feed(" Paris. The", None) == (" Paris.", None)


def test_earliest_completed_stop_wins() -> None:
    cutter = StopCutter(["stop here", "op"], keep=False)
    assert cutter.feed("a stop here", None) == ("a st", None)  # "op" is complete first


def test_tokens_stay_aligned_and_the_cut_token_is_shortened() -> None:
    cutter = StopCutter(["\n\n"], keep=False)
    text, tokens = cutter.feed(" a b\n", toks(" a", " b\n"))
    assert text == " a" and tokens is not None and [t.text for t in tokens] == [" a"]  # whole tokens held back
    text, tokens = cutter.feed("\nc", toks("\nc"))
    assert text == " b" and tokens is not None
    assert [(t.text, t.logprob) for t in tokens] == [(" b", -2.0)]  # " b\n" cut to " b", logprob kept


def test_fit_tokens_drops_what_is_past_the_text() -> None:
    assert [t.text for t in fit_tokens(toks(" Paris", ".", "</s>"), len(" Paris"))] == [" Paris"]


# --- logprobs and choices -------------------------------------------------------------------------------


def test_legacy_logprobs_offsets_and_top_entries() -> None:
    tokens = [TokenLogprob(" a", -0.5, {" a": -0.5, " b": -1.0, " c": -3.0}), TokenLogprob(" d", -2.0, {" e": -0.1})]
    out = legacy_logprobs(tokens, 5, 1)
    assert out["text_offset"] == [5, 7]
    assert out["top_logprobs"] == [{" a": -0.5}, {" e": -0.1, " d": -2.0}]  # k best, plus the chosen one
    assert legacy_logprobs([TokenLogprob("x", None)], 0, 3)["top_logprobs"] == [None]


def test_tracker_offsets_count_the_echoed_prompt() -> None:
    tracker = ChoiceTracker(req(echo=True, logprobs=0), "Hi", strips_stop=True)
    first = tracker.piece(" a", toks(" a"))
    last = tracker.last(" b", toks(" b"), "length", "")
    assert first is not None and first["text"] == "Hi a" and first["logprobs"]["text_offset"] == [2]
    assert last["text"] == " b" and last["logprobs"]["text_offset"] == [4] and last["finish_reason"] == "length"


def test_tracker_cut_stop_turns_finish_into_stop() -> None:
    tracker = ChoiceTracker(req(stop="."), "", strips_stop=False)
    assert tracker.piece(" Paris", None) == {"text": " Paris", "logprobs": None, "finish_reason": None}
    assert tracker.last(". Lyon", None, "length", "") == {"text": "", "logprobs": None, "finish_reason": "stop"}


def test_tracker_include_stop_from_the_upstreams_stopping_word() -> None:
    tracker = ChoiceTracker(req(stop=["!", "."], include_stop_str_in_output=True), "", strips_stop=True)
    assert tracker.last(" Paris", None, "stop", ".")["text"] == " Paris."


# --- guided choice -----------------------------------------------------------------------------------------


def test_choice_regex_escapes_metacharacters() -> None:
    assert choice_regex(["a.b", "(c)", "d e"]) == "(a\\.b|\\(c\\)|d e)"


def test_choice_grammar_escapes_gbnf_strings() -> None:
    assert choice_grammar(['say "hi"', "a\\b", "x\ny"]) == 'root ::= "say \\"hi\\"" | "a\\\\b" | "x\\ny"'


# --- value rules --------------------------------------------------------------------------------------------


def test_rules_refuse_by_value_and_say_why() -> None:
    assert TGI_CAPABILITIES.first_violation(req(prompt=[1, 2])) == "prompt"
    assert TGI_CAPABILITIES.first_violation(req(prompt="text")) is None
    assert LLAMACPP_CAPABILITIES.first_violation(req(prompt=[1, 2])) is None
    assert OLLAMA_CAPABILITIES.first_violation(req(echo=True, logprobs=1)) == "echo"
    assert OLLAMA_CAPABILITIES.first_violation(req(echo=True)) is None
    reason = TGI_CAPABILITIES.reason("prompt")
    assert reason is not None and "takes text only" in reason


def test_an_override_takes_over_the_fields_rules() -> None:
    relaxed = TGI_CAPABILITIES.with_overrides({"prompt": "translated"})
    assert relaxed.first_violation(req(prompt=[1, 2])) is None
    assert relaxed.first_violation(req(echo=True, logprobs=1)) == "echo"
    assert (
        TGI_CAPABILITIES.with_overrides({"presence_penalty": "native"}).first_violation(req(presence_penalty=1.0))
        is None
    )


@pytest.mark.parametrize("table", [OPENAI_CAPABILITIES, VLLM_CAPABILITIES, MOCK_CAPABILITIES])
def test_the_fast_paths_pay_nothing_for_rules(table: Capabilities) -> None:
    assert type(table) is Capabilities


# --- logprobs asked for, none sent ------------------------------------------------------------------


def test_text_without_the_logprobs_asked_for_is_an_error_naming_logprobs() -> None:
    """Both endpoints refuse the empty success an upstream that ignores the field would give."""
    tracker = ChoiceTracker(req(logprobs=1), "", strips_stop=True, backend="ol")
    with pytest.raises(UpstreamProtocolError) as completions:
        tracker.last("Hello", None, "stop", "")
    chat_request = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "logprobs": True}
    )
    turn = ChatTurn(chat_request, backend="ol", call_ids="r:0")
    with pytest.raises(UpstreamProtocolError) as chat:
        turn.message(ChatPiece(content="Hello", finish="stop"))
    for error in (completions.value, chat.value):
        assert error.param == "logprobs"
        assert error.reason == "no_logprobs"
        assert "backend 'ol' answered without the logprobs the request asked for" in str(error)
    # Nothing generated, nothing missing: no error.
    assert ChoiceTracker(req(logprobs=1), "", strips_stop=True).last("", None, "stop", "")["text"] == ""


@pytest.mark.parametrize(
    ("obj", "finish"), [({"done_reason": "stop"}, "stop"), ({"done_reason": "length"}, "length"), ({}, "stop")]
)
def test_ollama_finish_maps_done_reason_for_both_ollama_translators(obj: dict[str, Any], finish: str) -> None:
    # Shared from native.common: the completions translator (ollama.py) no longer reaches into
    # the chat translator (ollama_chat.py) for it.
    assert ollama_finish(obj, "o") == finish


@pytest.mark.parametrize("reason", ["load", "unload", "", "weird"])
def test_ollama_finish_refuses_a_done_reason_that_is_no_answer(reason: str) -> None:
    with pytest.raises(UpstreamProtocolError) as info:
        ollama_finish({"done_reason": reason}, "o")
    assert info.value.reason == "no_answer"
    assert "instead of answering" in str(info.value)
