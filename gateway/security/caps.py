"""Request caps: the largest request one caller may send, checked before anything is reserved or called.

A refusal is a 400 ``invalid_request_error`` with ``code: cap_exceeded``, ``param`` set
to the field the client can change and a message naming the cap and where it comes from
(the deployment's ``caps:`` or the key's ``auth.keys[].caps``). The same place bounds the
``prompt`` arrays and a ``prompt_embeds`` list (``server.max_prompt_array``, a hardening limit that
is always on); each of ``prompt_embeds`` is one more prompt for the ``prompts`` cap.

Token arithmetic used here and by the rate limiter (:func:`reserve_tokens`):

    prompt estimate + max tokens (16 when unset) x sequences x prompts

where ``sequences`` is ``max(n, best_of)`` (what an upstream generates for each prompt), and
text is estimated at 4 characters per token (token-id prompts count exactly); a chat
request's prompt is its messages, tools and response format, its max tokens
``max_completion_tokens`` or ``max_tokens`` (the request's own methods:
:class:`gateway.served.ServedRequest`). The estimate only decides admission; the rate
limiter settles from the upstream's real usage. A request that sets no max tokens (unbounded on
chat and Responses, 16 on completions) is sent with the ``max_tokens`` cap as its limit when the
default would exceed it (``on_missing: apply``, the default: the SDKs and LangChain send none), or
refused naming the field (``on_missing: refuse``).

Cost: :meth:`Caps.check` is a few attribute reads and comparisons; the prompt walk is
O(prompts) and only when the prompt is a batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from pydantic import BaseModel

from gateway.served import ServedRequest
from schemas.completions import CompletionRequest
from schemas.config import RequestCaps
from schemas.errors import CapExceededError

__all__ = ["CAP_FIELDS", "CapExceededError", "Caps", "reserve_tokens"]

CAP_FIELDS = ("n", "best_of", "max_tokens", "prompts", "total_tokens")


def reserve_tokens(request: ServedRequest) -> int:
    """Tokens a request may use at most (with the prompt estimated): what the limiter reserves."""
    return request.prompt_estimate() + request.output_limit * request.sequences * request.prompt_count


@dataclass(frozen=True, slots=True)
class Caps:
    """Effective caps for one caller (the lower of deployment and key) plus the prompt-array bound.

    ``sources`` says, per cap, where its value comes from (for the refusal message).
    """

    max_prompt_array: int
    n: int | None = None
    best_of: int | None = None
    max_tokens: int | None = None
    prompts: int | None = None
    total_tokens: int | None = None
    on_missing: str = "apply"  # a request without its output limit: "apply" the max_tokens cap, or "refuse"
    sources: tuple[tuple[str, str], ...] = ()

    @classmethod
    def build(
        cls, max_prompt_array: int, deployment: RequestCaps, key: RequestCaps | None = None, key_name: str = ""
    ) -> Caps:
        values: dict[str, int | None] = {}
        sources: list[tuple[str, str]] = []
        for name in CAP_FIELDS:
            mine: int | None = getattr(deployment, name)
            theirs: int | None = getattr(key, name) if key is not None else None
            if theirs is not None and (mine is None or theirs < mine):
                values[name] = theirs
                sources.append((name, f"key '{key_name}'"))
            else:
                values[name] = mine
                if mine is not None:
                    sources.append((name, "this deployment"))
        on_missing = (
            key.on_missing if key is not None and "on_missing" in key.model_fields_set else deployment.on_missing
        )
        return cls(max_prompt_array, on_missing=on_missing, sources=tuple(sources), **values)

    @property
    def any(self) -> bool:
        return any(getattr(self, name) is not None for name in CAP_FIELDS)

    def check(self, request: ServedRequest) -> ServedRequest:
        """The request to serve: ``request``, or a copy with the ``max_tokens`` cap as its output limit
        when it set none (``on_missing: apply``); raises :class:`CapExceededError` for the first cap
        it goes over."""
        array = request.prompt_array
        if array is not None:
            self._check_prompt_array(array)
        # ``__class__ is``, not isinstance(): no call on the request path (chat and the rest have no embeddings).
        if request.__class__ is CompletionRequest and request.prompt_embeds is not None:
            self._check_embeds(request.prompt_embeds)
        n, best_of = request.n, request.best_of
        if self.n is not None and n is not None and n > self.n:
            raise self._over("n", "n", f"'n' is {n}")
        if self.best_of is not None and best_of is not None and best_of > self.best_of:
            raise self._over("best_of", "best_of", f"'best_of' is {best_of}")
        param = request.output_limit_param
        if self.max_tokens is not None:
            if (
                self.on_missing == "apply"
                and not request.output_limit_set
                and (not request.output_bounded or request.output_limit > self.max_tokens)
            ):
                # Sent with the cap as its limit (a frozen model: a copy; the field counts as set).
                model = cast(BaseModel, request).model_copy(update={param: self.max_tokens})
                request = cast(ServedRequest, model)
            elif not request.output_bounded:
                raise self._over(
                    "max_tokens",
                    param,
                    f"'{param}' is unset, so the reply may run to the model's context length",
                    advice=f"set it to at most {self.max_tokens}",
                )
            if request.output_limit > self.max_tokens:
                unset = "" if request.output_limit_set else " (the default when unset)"
                raise self._over("max_tokens", param, f"'{param}' is {request.output_limit}{unset}")
        if self.prompts is not None and request.prompt_count > self.prompts:
            raise self._over("prompts", "prompt", f"'prompt' holds {request.prompt_count} prompts")
        if self.total_tokens is not None:
            total = reserve_tokens(request)
            if total > self.total_tokens:
                raise self._over(
                    "total_tokens",
                    param,
                    f"this request may use up to {total} tokens (prompt estimate + {param} x n x prompts)",
                )
        return request

    def _check_prompt_array(self, prompt: list[str] | list[int] | list[list[int]]) -> None:
        limit = self.max_prompt_array
        if len(prompt) > limit:
            raise CapExceededError(
                f"'prompt' is an array of {len(prompt)} items; at most {limit} are accepted",
                param="prompt",
                cap="prompt_array",
            )
        if prompt and type(prompt[0]) is list:
            for inner in prompt:
                if isinstance(inner, list) and len(inner) > limit:
                    raise CapExceededError(
                        f"a prompt in 'prompt' has {len(inner)} token ids; at most {limit} are accepted",
                        param="prompt",
                        cap="prompt_array",
                    )

    def _check_embeds(self, embeds: str | list[str] | None) -> None:
        """``prompt_embeds`` (one tensor per prompt) is bounded like a prompt array; its bytes by the body limit."""
        if isinstance(embeds, list) and len(embeds) > self.max_prompt_array:
            raise CapExceededError(
                f"'prompt_embeds' is an array of {len(embeds)} items; at most {self.max_prompt_array} are accepted",
                param="prompt_embeds",
                cap="prompt_array",
            )

    def _over(self, cap: str, param: str, what: str, *, advice: str | None = None) -> CapExceededError:
        source = dict(self.sources).get(cap, "this deployment")
        tail = f"; {advice}" if advice else ""
        return CapExceededError(
            f"{what}, over the {cap} cap of {getattr(self, cap)} set for {source}{tail}.", param=param, cap=cap
        )
