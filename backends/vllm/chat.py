"""vLLM's chat dialect: a chat request in one vLLM server's form, and its chat answers back in OpenAI's.

Request side (:func:`translate_chat`, on the OpenAI-family body of ``backends.openai.chat``),
per server version and tool parser (:class:`~backends.vllm.versions.VLLMChatFeatures`;
the capability table refused, by name, what the server cannot honour):

- ``guided_*`` <-> ``structured_outputs`` as for completions
  (:func:`~backends.vllm.dialect.translate_structured`): vLLM >= 0.12 ignores ``guided_*``
  with HTTP 200, so they go as ``structured_outputs`` from 0.11; ``response_format``
  goes as it is (every version applies it);
- ``max_completion_tokens`` goes as ``max_tokens`` before 0.6.4 (and while the version is
  unknown: every version reads ``max_tokens``);
- ``parallel_tool_calls`` is sent only from 0.12, where ``false`` is honoured; before, only
  ``true`` can get here (the table refuses ``false``), which is vLLM's behaviour anyway;
- ``tool_choice`` goes as it is: which forms a server takes (version, ``--tool-call-parser``)
  is the table's business;
- ``n > 1`` at temperature 0 on >= 0.12 (vLLM refuses greedy ``n``): sent as ``n = 1`` and
  the choice replicated in the gateway, as for completions (not with ``use_beam_search``:
  there ``n`` is the beam width, and beams are not sampled);
- streams ask for usage explicitly (``include_usage: true``): the default of an empty
  ``stream_options`` flipped to false at 0.18.

Answer side: :func:`normalise_chat_body` rebuilds a non-streamed ``chat.completion`` in
OpenAI's shape (vLLM-only fields such as ``stop_reason``, ``kv_transfer_params``, empty
``tool_calls`` lists dropped, the ``""`` content of a forced call as ``null``; what the client
asked for kept: ``prompt_logprobs``, ``prompt_token_ids`` with each choice's ``token_ids`` for
``return_token_ids``, each choice's ``routed_experts`` for ``routed_experts_prompt_start``, the
server's ``kv_transfer_params`` / ``ec_transfer_params`` for a request that sent some; see
:func:`asked_chat_fields`), maps ``finish_reason`` like
completions (:func:`~backends.vllm.dialect.map_finish_reason`) and names the reasoning text
:data:`REASONING_FIELD`; streams do the same in ``backends.vllm.stream.VLLMChatStreamRelay``.

Why ``reasoning_content``: it is the name DeepSeek's API introduced and the one
OpenAI-compatible clients read (LangChain's DeepSeek/OpenAI-compatible chat models,
LiteLLM, Open WebUI), and what vLLM itself sent through 0.15; vLLM 0.16+ sends ``reasoning``
only, 0.12-0.15 both. Clients get ``reasoning_content`` and never both.
"""

from __future__ import annotations

from typing import Any

from backends.base import ChatCall, CompletionResult, usage_of
from backends.emulation.best_of import is_greedy, replicate_choices, scale_usage
from backends.exact_json import dumps_exact
from backends.vllm.dialect import answer_envelope, asked_extras, map_finish_reason, translate_structured
from backends.vllm.stream import rename_reasoning
from backends.vllm.versions import VLLMChatFeatures
from schemas.chat import ChatCompletionRequest

__all__ = [
    "REASONING_FIELD",
    "asked_chat_fields",
    "chat_result",
    "normalise_chat_body",
    "replication",
    "translate_chat",
]

REASONING_FIELD = "reasoning_content"

_CHAT_FINISH = frozenset({None, "stop", "length", "content_filter", "tool_calls", "function_call"})


def replication(request: ChatCompletionRequest, features: VLLMChatFeatures) -> int:
    """How many copies of one greedy choice the gateway makes (1: none; the server makes the ``n``)."""
    n = request.n or 1
    if n > 1 and is_greedy(request.temperature) and not features.base.greedy_n and not request.use_beam_search:
        return n
    return 1


def translate_chat(fields: dict[str, Any], features: VLLMChatFeatures, copies: int) -> None:
    """Rewrite an OpenAI-family chat body (built from the client's request) into this server's form, in place."""
    translate_structured(fields, features.base)
    if not features.since("max_completion_tokens") and "max_completion_tokens" in fields:
        fields["max_tokens"] = fields.pop("max_completion_tokens")
    if not features.since("parallel_tool_calls_false"):
        fields.pop("parallel_tool_calls", None)
    if copies > 1:
        fields["n"] = 1


def asked_chat_fields(request: ChatCompletionRequest | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """vLLM's extra fields the client asked for (kept): (top-level, per choice), in vLLM's order."""
    if request is None:
        return (), ()
    top: tuple[str, ...] = ()
    per_choice: tuple[str, ...] = ()
    if request.prompt_logprobs is not None:
        top += ("prompt_logprobs",)
    if request.return_token_ids:
        top += ("prompt_token_ids",)
        per_choice += ("token_ids",)
    extra_top, extra_choice = asked_extras(request)
    return top + extra_top, per_choice + extra_choice


def normalise_chat_body(
    obj: dict[str, Any], public_model: str, backend: str, request: ChatCompletionRequest | None = None
) -> dict[str, Any]:
    """A vLLM ``chat.completion`` body in OpenAI's shape, with the client's model name.

    vLLM's extra fields are dropped unless ``request`` asked for them (:func:`asked_chat_fields`).
    """
    top, per_choice = asked_chat_fields(request)
    choices = []
    for choice in obj["choices"]:
        finish = choice.get("finish_reason")
        if finish not in _CHAT_FINISH:
            finish = map_finish_reason(finish, backend)
        message = choice.get("message")
        if not isinstance(message, dict):
            message = {}
        rename_reasoning(message)
        tool_calls = message.get("tool_calls")
        content = message.get("content")
        if tool_calls and content == "":
            # vLLM builds named/required answers with ``content or ""``; OpenAI sends null beside calls.
            content = None
        out_message: dict[str, Any] = {
            "role": message.get("role") or "assistant",
            "content": content,
            "refusal": message.get("refusal"),
        }
        if message.get(REASONING_FIELD) is not None:
            out_message[REASONING_FIELD] = message[REASONING_FIELD]
        if tool_calls:  # vLLM sends [] when there are none; OpenAI leaves the key out
            out_message["tool_calls"] = tool_calls
        out_choice = {
            "index": choice.get("index", 0),
            "message": out_message,
            "logprobs": choice.get("logprobs"),
            "finish_reason": finish,
        }
        for name in per_choice:
            out_choice[name] = choice.get(name)
        choices.append(out_choice)
    out = answer_envelope(obj, "chat.completion", public_model, choices)
    for name in top:
        out[name] = obj.get(name)
    return out


def chat_result(obj: dict[str, Any], call: ChatCall, backend: str, copies: int) -> CompletionResult:
    """A parsed vLLM ``chat.completion`` as the chat call's result.

    For a client: rebuilt in OpenAI's shape (:func:`normalise_chat_body`), the greedy copies made,
    serialised. For the gateway itself (``call.for_client`` false: the Responses bridge, which reads
    the object and never the bytes): the answer as vLLM sent it, with no body, once the finish
    reasons that mean there is no answer (``abort``, ``error``) raised as for a client; the bridge
    reads either reasoning name, an empty ``tool_calls`` and the ``""`` content beside calls as the
    rebuilt answer would give them (``tests/backends/vllm/test_vllm_chat_result.py``).
    """
    if not call.for_client and copies == 1:
        for choice in obj["choices"]:
            finish = choice.get("finish_reason") if type(choice) is dict else None  # the bridge refuses a non-object
            if type(finish) is str and finish not in _CHAT_FINISH:
                map_finish_reason(finish, backend)  # raises for abort and error; any other is a stop
        return CompletionResult(b"", usage_of(obj.get("usage")), answer=obj)
    out = normalise_chat_body(obj, call.public_model, backend, call.request)
    if copies > 1:
        out["choices"] = replicate_choices(out["choices"], copies)
        out["usage"] = scale_usage(out.get("usage"), copies)
    return CompletionResult(dumps_exact(out, backend), usage_of(out["usage"]), answer=out)
