"""Our request in a given vLLM version's form, and vLLM's answers back in OpenAI's.

Request side (:class:`VLLMDialect`, one per detected version):

- ``guided_json|regex|choice|grammar`` go as they are before 0.11 and as
  ``structured_outputs: {json|regex|choice|grammar}`` from 0.11 (0.12 ignores
  the old fields, so sending them would come back unconstrained);
- ``response_format`` goes as it is from 0.12; before, ``json_schema`` goes as ``guided_json``
  (< 0.11) or ``structured_outputs.json`` (0.11), and ``json_object`` inside ``structured_outputs``
  on 0.11 (which applies it only there);
- ``best_of`` goes as it is where vLLM still ranks server-side (< 0.10), is
  dropped when it equals ``n``, and is otherwise emulated
  (:mod:`backends.emulation.best_of`): ``n = best_of`` candidates with logprobs;
- ``n > 1`` with ``temperature: 0`` is sent as ``n = 1`` and replicated where
  vLLM refuses greedy ``n`` (>= 0.12), except with beam search (beam width is n);
- fields a version cannot honour are refused by the capability table
  (:mod:`backends.vllm.versions`) before routing; :meth:`VLLMDialect.check`
  repeats that check at send time in case the version changed in between.

Response side: :func:`normalise_body` rebuilds a non-streamed body in OpenAI's
shape (vLLM-only fields such as ``stop_reason``, ``token_ids``,
``prompt_logprobs``, ``kv_transfer_params`` dropped unless the request asked for
them: :func:`asked_choice_fields`, :func:`asked_extras`) and maps ``finish_reason`` (:func:`map_finish_reason`);
:func:`vllm_error` turns any vLLM error body (flat before 0.10.1, nested after,
bare string for 401) into our error type, keeping ``param`` when it names one of
the client's fields.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Any

from backends.capabilities import Capabilities
from backends.emulation.best_of import is_greedy
from backends.errors import (
    UpstreamGenerationError,
    UpstreamStatusError,
    error_from_upstream_body,
)
from backends.vllm.capabilities import capabilities_for
from backends.vllm.versions import BOUNDARIES, VLLMFeatures, VLLMVersion, parse_version
from schemas.chat import ChatCompletionRequest
from schemas.chat_messages import JSONSchemaResponseFormat
from schemas.completions import CompletionRequest

__all__ = [
    "GUIDED_TO_STRUCTURED",
    "STRUCTURED_TO_GUIDED",
    "VERSION_DEPENDENT_FIELDS",
    "Plan",
    "UpstreamGenerationError",
    "VLLMDialect",
    "asked_choice_fields",
    "fingerprint_version",
    "format_ignored",
    "map_finish_reason",
    "normalise_body",
    "translate_response_format",
    "translate_structured",
    "vllm_error",
]

GUIDED_TO_STRUCTURED: dict[str, str] = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
    "guided_whitespace_pattern": "whitespace_pattern",
}

# Fields whose handling depends on the version; a request setting none of them is sent as
# the client wrote it (the zero-translation fast path).
VERSION_DEPENDENT_FIELDS: frozenset[str] = frozenset(
    {
        *GUIDED_TO_STRUCTURED, "guided_decoding_backend", "best_of", "n", "early_stopping", "structured_outputs",
        "response_format",
    }
)  # fmt: skip
STRUCTURED_TO_GUIDED: dict[str, str] = {wire: name for name, wire in GUIDED_TO_STRUCTURED.items()}


class Plan(Enum):
    """How one request is carried out on one version."""

    FORWARD = "forward"  # one upstream request (possibly translated), answer relayed
    BEST_OF = "best_of"  # n = best_of candidates with logprobs, ranked in the gateway
    REPLICATE = "replicate"  # n = 1 greedy, the choice repeated n times in the gateway


@dataclass(frozen=True, slots=True)
class VLLMDialect:
    """The request and response rules of one vLLM version."""

    features: VLLMFeatures

    @classmethod
    def of(cls, version: VLLMVersion | None) -> VLLMDialect:
        return cls(VLLMFeatures.of(version))

    @property
    def capabilities(self) -> Capabilities:
        return capabilities_for(self.features)

    # --- request ----------------------------------------------------------------------
    def plan(self, request: CompletionRequest) -> tuple[Plan, int]:
        """The plan and its fan-out factor (candidates per prompt, or copies per prompt)."""
        n = request.n or 1
        best_of = request.best_of or n
        if request.use_beam_search:
            return Plan.FORWARD, 1  # beam width is n; greedy n is legitimate there
        if best_of > n and not self.features.native_best_of:
            if is_greedy(request.temperature) and not self.features.greedy_n:
                return Plan.REPLICATE, best_of
            return Plan.BEST_OF, best_of
        k = max(n, best_of)
        if k > 1 and is_greedy(request.temperature) and not self.features.greedy_n:
            return Plan.REPLICATE, k
        return Plan.FORWARD, 1

    def translate(self, fields: dict[str, Any], request: CompletionRequest, plan: Plan, factor: int) -> None:
        """Rewrite an upstream body (built from ``request`` as the client sent it) in place."""
        features = self.features
        translate_response_format(fields, request, features)
        translate_structured(fields, features)
        if not features.native_best_of:
            fields.pop("best_of", None)
        match plan:
            case Plan.BEST_OF:
                fields["n"] = factor
                if request.logprobs is None:
                    fields["logprobs"] = 1  # needed for ranking; stripped from the answer
            case Plan.REPLICATE:
                fields["n"] = 1
                fields.pop("best_of", None)
            case Plan.FORWARD:
                pass


def translate_response_format(fields: dict[str, Any], request: CompletionRequest, features: VLLMFeatures) -> None:
    """A completions ``response_format`` in a form a version before 0.12 applies, in place.

    Before 0.11 ``json_object`` goes as-is (vLLM applies it as guided_json_object) and a
    ``json_schema`` goes as ``guided_json``; on 0.11 both go inside ``structured_outputs`` (0.11
    applies json_object only there). The capability table refused the forms with no such place.
    """
    fmt = request.response_format
    version = features.version
    if fmt is None or version is None or version >= BOUNDARIES["response_format"] or fmt.type == "text":
        return
    if features.structured_outputs:  # 0.11
        fields.pop("response_format", None)
        structured = dict(fields.get("structured_outputs") or {})  # options only (the schema allows one constraint)
        if isinstance(fmt, JSONSchemaResponseFormat):
            structured["json"] = fmt.json_schema.schema_
        else:
            structured["json_object"] = True
        fields["structured_outputs"] = structured
    elif isinstance(fmt, JSONSchemaResponseFormat):
        fields.pop("response_format", None)
        fields["guided_json"] = fmt.json_schema.schema_


def format_ignored(
    request: CompletionRequest | ChatCompletionRequest, sent: VLLMFeatures, server: VLLMFeatures
) -> bool:
    """Whether a server of ``server``'s version ignores the completions ``response_format`` as sent
    for ``sent``'s version (:func:`translate_response_format`): the answer may be unconstrained."""
    fmt = request.response_format if isinstance(request, CompletionRequest) else None  # chat's: every version
    if fmt is None or fmt.type == "text" or sent.version is None or server.version is None:
        return False
    since = BOUNDARIES["response_format"]
    if sent.version >= since or (not sent.structured_outputs and fmt.type == "json_object"):
        # As sent: a schema or structural tag needs 0.12; json_object alone is ignored by 0.11 only.
        if fmt.type == "json_object":
            return server.structured_outputs and server.version < since
        return server.version < since
    if sent.structured_outputs:  # inside structured_outputs (0.11): every version from 0.11 applies it
        return not server.structured_outputs
    return not server.guided_fields  # as guided_json (< 0.11): ignored from 0.12


def translate_structured(fields: dict[str, Any], features: VLLMFeatures) -> None:
    """``guided_*`` <-> ``structured_outputs`` in the form this version applies (both endpoints), in place."""
    if features.structured_outputs:
        structured = {GUIDED_TO_STRUCTURED[name]: fields.pop(name) for name in GUIDED_TO_STRUCTURED if name in fields}
        if structured:
            fields["structured_outputs"] = structured
        # Only ever its neutral value here (the capability check refused anything else).
        fields.pop("guided_decoding_backend", None)
    elif "structured_outputs" in fields:
        # Before 0.11 the same constraints are top-level guided_* fields; the capability
        # table refused the options that have no guided_* form, so this is faithful.
        for wire, value in fields.pop("structured_outputs").items():
            name = STRUCTURED_TO_GUIDED.get(wire)
            if name is not None:
                fields[name] = value


# --- response ---------------------------------------------------------------------------

_OPENAI_FINISH = frozenset({"stop", "length", "content_filter", None})
_FINISH_AS_STOP = frozenset({"repetition"})


def map_finish_reason(value: Any, backend: str) -> str:
    """vLLM ``finish_reason`` values outside OpenAI's enum.

    ``repetition`` (0.33: repetition detection ended the text) and any value we do
    not know become ``stop`` (the server ended the text on purpose); ``abort``
    (the engine dropped the request, e.g. shutting down) and ``error`` (it failed
    mid-generation) mean there is no usable answer: :class:`UpstreamGenerationError`,
    retryable for ``abort`` only.
    """
    if value == "abort":
        error = UpstreamGenerationError(
            "the vLLM server aborted the generation (finish_reason 'abort')", backend=backend, reason="finish_abort"
        )
        error.retryable = True
        raise error
    if value == "error":
        raise UpstreamGenerationError(
            "the vLLM server failed during generation (finish_reason 'error')", backend=backend, reason="finish_error"
        )
    return "stop"


def asked_choice_fields(request: CompletionRequest | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """vLLM's extra fields the client asked for (kept): (top-level, per choice), in vLLM's order."""
    if request is None:
        return (), ()
    kept: tuple[str, ...] = ()
    if request.prompt_logprobs is not None:
        kept += ("prompt_logprobs",)
    if request.return_token_ids:
        kept += ("prompt_token_ids", "token_ids")
    # asked_extras' fields, looked at here first: a plain request makes no second call.
    if request.kv_transfer_params is None and request.ec_transfer_params is None:
        if request.routed_experts_prompt_start is None:
            return (), kept
    top, per_choice = asked_extras(request)
    return top, kept + per_choice


def asked_extras(request: CompletionRequest | ChatCompletionRequest) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The answer's fields that vLLM's own request fields (``schemas.vllm_extras``) ask for, on both
    endpoints: (top-level, per choice)."""
    top: tuple[str, ...] = ()
    if request.kv_transfer_params is not None:
        top += ("kv_transfer_params",)  # what the decode step needs from this prefill (P/D disaggregation)
    if request.ec_transfer_params is not None:
        top += ("ec_transfer_params",)  # the same for the encoder cache (E/P/D disaggregation)
    per_choice = ("routed_experts",) if request.routed_experts_prompt_start is not None else ()
    return top, per_choice


def normalise_body(
    obj: dict[str, Any], public_model: str, backend: str, request: CompletionRequest | None = None
) -> dict[str, Any]:
    """A vLLM ``text_completion`` body in OpenAI's shape, with the client's model name.

    vLLM's extra fields are dropped unless ``request`` asked for them (``prompt_logprobs``,
    ``return_token_ids``, ``routed_experts_prompt_start``: see :func:`asked_choice_fields`; the
    server's ``kv_transfer_params`` / ``ec_transfer_params`` for a request that sent some).
    Cost on the plain path: one small dict per choice, which also makes the
    serialised answer shorter (vLLM adds five null fields per choice).
    """
    top, extras = asked_choice_fields(request)
    choices = []
    for choice in obj["choices"]:
        finish = choice.get("finish_reason")
        if finish not in _OPENAI_FINISH:
            finish = map_finish_reason(finish, backend)
        out_choice = {
            "text": choice.get("text", ""),
            "index": choice.get("index", 0),
            "logprobs": choice.get("logprobs"),
            "finish_reason": finish,
        }
        for name in extras:
            out_choice[name] = choice.get(name)
        choices.append(out_choice)
    out = answer_envelope(obj, "text_completion", public_model, choices)
    for name in top:
        out[name] = obj.get(name)
    return out


def answer_envelope(obj: dict[str, Any], object_: str, public_model: str, choices: list[Any]) -> dict[str, Any]:
    """A rebuilt vLLM answer in OpenAI's shape: its id, created, fingerprint and usage around
    ``choices``, with the client's model name (vLLM-only top-level fields are not carried)."""
    out: dict[str, Any] = {
        "id": obj.get("id"),
        "object": object_,
        "created": obj.get("created"),
        "model": public_model,
        "choices": choices,
    }
    fingerprint = obj.get("system_fingerprint")
    if fingerprint is not None:
        out["system_fingerprint"] = fingerprint
    out["usage"] = obj.get("usage")
    return out


_FINGERPRINT = re.compile(r"^vllm-(\d+\.\d+(?:\.\d+)?)")


def fingerprint_version(obj: dict[str, Any]) -> VLLMVersion | None:
    """The version in vLLM's ``system_fingerprint`` (``"vllm-0.32.0-ab2b2829"``), if it carries one."""
    fingerprint = obj.get("system_fingerprint")
    if not isinstance(fingerprint, str):
        return None
    match = _FINGERPRINT.match(fingerprint)
    return parse_version(match[1]) if match else None


# --- errors -------------------------------------------------------------------------------

# vLLM's name for a field -> ours, where they differ (prompt_embeds: unless the client sent some).
_PARAM_NAMES = {"input_tokens": "prompt", "prompt_embeds": "prompt"}


def vllm_error(
    status: int, body: bytes, retry_after: str | None, backend: str, request: CompletionRequest | ChatCompletionRequest
) -> UpstreamStatusError:
    """Our error for a vLLM error answer (``backends.errors``), with vLLM's names for fields made ours."""

    def rename(param: str) -> str:
        if param == "prompt_embeds" and getattr(request, "prompt_embeds", None) is not None:
            return param
        name = _PARAM_NAMES.get(param, param)
        if name == "structured_outputs":
            # The constraint the client wrote, under the name it used.
            name = next((g for g in GUIDED_TO_STRUCTURED if getattr(request, g) is not None), name)
        return name

    fields = type(request).model_fields  # the request's own endpoint: a chat field is no completions param
    return error_from_upstream_body(status, body, retry_after, backend, rename=rename, fields=fields)
