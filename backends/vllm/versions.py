"""vLLM server versions: parsing, what each version does with our fields, and its capability table.

Why this exists: vLLM changed its Completions API under our users (see
``shared/spec/completions-protocol.md`` section 6). From 0.10.1 unknown fields
are *ignored*, so a field a version dropped fails open with HTTP 200: ``guided_*``
from 0.12 (output comes back unconstrained), ``best_of`` from 0.12 (refused by
V1 from 0.10), ``early_stopping`` since the beam-search rewrite, and no V1
structured-output backend applies a per-request whitespace pattern. Each field
is therefore forwarded, translated, emulated or refused *by version*.

:class:`VLLMFeatures` states the behaviour of one version as booleans, with the
version boundaries in one table (:data:`BOUNDARIES`) so they can be read and
tested in one place. :func:`capabilities_for` turns features into the frozen
capability table the router checks per request; tables are computed once per
distinct feature set (cached), never per request.

An unknown version (no ``GET /version`` answer and no ``version:`` pin) gets the
features that cannot fail open: structured output refused, best_of and greedy
``n`` emulated (both work on every version).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from backends.capabilities import EMPTY_PROMPT, Capabilities, Level, Rule, empty_prompt

__all__ = ["BOUNDARIES", "VLLM_MAX_LOGPROBS", "VLLMFeatures", "VLLMVersion", "capabilities_for", "parse_version"]


class VLLMVersion(NamedTuple):
    major: int
    minor: int
    patch: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


_VERSION = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str) -> VLLMVersion | None:
    """``"0.32.0"``, ``"0.6.3.post1"``, ``"0.11.1rc2.dev5+gabc"`` -> (major, minor, patch); else None.

    A pre-release of x.y.z is treated as x.y.z: vLLM's protocol changes land
    before the release, so the pre-release already has the new behaviour.
    """
    match = _VERSION.match(text)
    if match is None:
        return None
    return VLLMVersion(int(match[1]), int(match[2]), int(match[3] or 0))


# First version with each behaviour (sources: spec section 6 and the 0.32.0 wheel).
BOUNDARIES: dict[str, VLLMVersion] = {
    # V1 became the default engine; it applies no per-request whitespace pattern.
    "v1_engine": VLLMVersion(0, 8, 0),
    # V1 answers 400 "vLLM V1 does not yet support best_of" (0.10.1.1, 0.11); removed (ignored) in 0.12.
    "no_native_best_of": VLLMVersion(0, 10, 0),
    # ``structured_outputs`` accepted; guided_* deprecated but still honoured in 0.11.
    "structured_outputs": VLLMVersion(0, 11, 0),
    # guided_* removed: ignored with a log line, output unconstrained.
    "no_guided_fields": VLLMVersion(0, 12, 0),
    # "n must be 1 when using greedy sampling".
    "no_greedy_n": VLLMVersion(0, 12, 0),
    # Beam search moved to its own parameters (BeamSearchParams) without early_stopping.
    "no_early_stopping": VLLMVersion(0, 6, 3),
    # ``return_token_ids`` (token_ids / prompt_token_ids in the answer).
    "return_token_ids": VLLMVersion(0, 11, 0),
    # ``truncation_side``: first seen in the 0.32.0 wheel (not in 0.12.0).
    "truncation_side": VLLMVersion(0, 32, 0),
}

# vLLM's ModelConfig default for --max-logprobs (it bounds logprobs and prompt_logprobs).
VLLM_MAX_LOGPROBS = 20


@dataclass(frozen=True, slots=True)
class VLLMFeatures:
    """What one vLLM version does with the fields whose handling changed."""

    version: VLLMVersion | None  # None: unknown
    structured_outputs: bool  # send guided_* as ``structured_outputs`` (>= 0.11)
    guided_fields: bool  # top-level guided_* honoured (< 0.12)
    native_best_of: bool  # best_of > n honoured server-side (< 0.10)
    greedy_n: bool  # n > 1 with temperature 0 accepted (< 0.12)
    whitespace_pattern: bool  # guided_whitespace_pattern applied (V0 engine, < 0.8)
    per_request_backend: bool  # guided_decoding_backend has somewhere to go (< 0.11)
    early_stopping: bool  # beam search honours early_stopping (< 0.6.3)
    return_token_ids: bool = False  # token ids in the answer when asked (>= 0.11)
    truncation_side: bool = False  # truncation_side honoured (>= 0.32)

    @classmethod
    def of(cls, version: VLLMVersion | None) -> VLLMFeatures:
        if version is None:
            # Nothing that could come back unconstrained or silently different.
            return cls(None, False, False, False, False, False, False, False, False, False)
        return cls(
            version=version,
            structured_outputs=version >= BOUNDARIES["structured_outputs"],
            guided_fields=version < BOUNDARIES["no_guided_fields"],
            native_best_of=version < BOUNDARIES["no_native_best_of"],
            greedy_n=version < BOUNDARIES["no_greedy_n"],
            whitespace_pattern=version < BOUNDARIES["v1_engine"],
            per_request_backend=version < BOUNDARIES["structured_outputs"],
            early_stopping=version < BOUNDARIES["no_early_stopping"],
            return_token_ids=version >= BOUNDARIES["return_token_ids"],
            truncation_side=version >= BOUNDARIES["truncation_side"],
        )

    @property
    def structured_output(self) -> bool:
        """Whether guided_* constraints can be sent in a form this version applies."""
        return self.structured_outputs or self.guided_fields

    @property
    def label(self) -> str:
        return str(self.version) if self.version is not None else "unknown"


_GUIDES = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
_UNKNOWN = "the vLLM server's version is unknown (GET /version failed and the backend has no `version:` pin), so "


def refusal_reasons(features: VLLMFeatures) -> dict[str, str]:
    """Why each field this version cannot honour is refused (field -> reason)."""
    v = features.label
    reasons: dict[str, str] = _answer_reasons(features)
    if not features.structured_output:
        for name in (*_GUIDES, "guided_decoding_backend", "guided_whitespace_pattern", "structured_outputs"):
            reasons[name] = (
                _UNKNOWN
                + "the gateway cannot send a structured-output constraint in a form it is sure the server applies"
            )
        return reasons | _beam_reasons(features)
    if not features.per_request_backend:
        reasons["guided_decoding_backend"] = (
            f"vLLM {v} selects the structured-output backend server-wide "
            "(--structured-outputs-config); a per-request backend cannot be honoured"
        )
    if not features.whitespace_pattern:
        reasons["guided_whitespace_pattern"] = (
            f"vLLM {v} (V1 engine) applies no per-request whitespace pattern to JSON constraints"
        )
    return reasons | _beam_reasons(features)


def _answer_reasons(features: VLLMFeatures) -> dict[str, str]:
    """Fields a version would ignore (from 0.10.1 unknown fields are dropped with HTTP 200)."""
    v = features.label
    reasons: dict[str, str] = {}
    if features.version is None:
        reasons["return_tokens_as_token_ids"] = _UNKNOWN + "the gateway cannot tell whether it would be ignored"
    if not features.return_token_ids:
        reasons["return_token_ids"] = (
            _UNKNOWN + "the gateway cannot tell whether it would be ignored"
            if features.version is None
            else f"vLLM {v} has no return_token_ids (added in 0.11)"
        )
    if not features.truncation_side:
        reasons["truncation_side"] = (
            _UNKNOWN + "the gateway cannot tell whether it would be ignored"
            if features.version is None
            else f"vLLM {v} has no truncation_side (first in 0.32)"
        )
    return reasons


def _beam_reasons(features: VLLMFeatures) -> dict[str, str]:
    if features.early_stopping:
        return {}
    return {
        "early_stopping": f"vLLM {features.label} beam search has no early_stopping "
        "(removed in 0.6.3; newer servers ignore the field)"
    }


# StructuredOutputsParams options with no top-level guided_* field before 0.11.
_STRUCTURED_ONLY = (
    "json_object",
    "disable_fallback",
    "disable_any_whitespace",
    "disable_additional_properties",
    "structural_tag",
)


def _structured_rules(features: VLLMFeatures) -> tuple[Rule, ...]:
    """What a ``structured_outputs`` a version accepts cannot carry (by value, so a Rule)."""
    rules: list[Rule] = []
    if features.structured_output and not features.structured_outputs:
        rules.append(
            Rule(
                "structured_outputs",
                f"vLLM {features.label} takes only json, regex, choice, grammar and whitespace_pattern "
                f"(as guided_*); {', '.join(_STRUCTURED_ONLY)} need vLLM >= 0.11",
                lambda r: (
                    r.structured_outputs is not None
                    and any(getattr(r.structured_outputs, name) not in (None, False) for name in _STRUCTURED_ONLY)
                ),
            )
        )
    if features.structured_output and not features.whitespace_pattern:
        rules.append(
            Rule(
                "structured_outputs",
                f"vLLM {features.label} (V1 engine) applies no per-request whitespace_pattern to JSON constraints",
                lambda r: r.structured_outputs is not None and r.structured_outputs.whitespace_pattern is not None,
            )
        )
    return tuple(rules)


_EMPTY_PROMPT_RULE = Rule(
    "prompt", f'{EMPTY_PROMPT}: vLLM refuses it ("prompt ... must be provided and non-empty")', empty_prompt
)


@lru_cache(maxsize=32)
def capabilities_for(features: VLLMFeatures) -> Capabilities:
    """The capability table of one version (cached: computed once per feature set)."""
    reasons = refusal_reasons(features)
    levels: dict[str, Level] = dict.fromkeys(reasons, Level.UNSUPPORTED)
    if features.structured_output and features.structured_outputs:
        for name in _GUIDES:
            levels[name] = Level.TRANSLATED
    elif features.structured_output:
        levels["structured_outputs"] = Level.TRANSLATED  # sent as guided_* (< 0.11)
    if not features.native_best_of:
        levels["best_of"] = Level.EMULATED
    if not features.greedy_n:
        levels["n"] = Level.EMULATED  # n > 1 with temperature 0: replicated greedy choice
    limits = {"logprobs": VLLM_MAX_LOGPROBS, "prompt_logprobs": VLLM_MAX_LOGPROBS}
    rules = (_EMPTY_PROMPT_RULE, *_structured_rules(features))
    table = Capabilities.of(Level.NATIVE, **levels).with_rules(rules).with_limits(limits)
    return table.with_reasons(reasons)
