"""The chat capability table: which Chat Completions fields (and *forms* of them) a backend honours.

This module is the machinery shared by every family; each family's table lives in its own folder
(``backends/openai/capabilities.py``, ``backends/mock/capabilities.py``,
``backends/native/<server>_capabilities.py``, ``backends/vllm/capabilities.py``).
A chat table has these layers, all data (spec chat-protocol.md is the source of every entry):

- ``fields``: a :class:`~backends.capabilities.Capabilities` with a level per field of
  :class:`~schemas.chat.ChatCompletionRequest` (native / translated / emulated / unsupported);
  an unsupported field is refused unless the client set it to its neutral "off" value.
- ``forms``: levels for the *values* of a field whose shapes differ per backend, keyed
  ``"field=form"``: ``tool_choice=required``, ``response_format=json_schema``,
  ``messages=input_audio`` (a content-part type), ``tools=custom``, ``tools=strict`` (a function
  tool with ``strict: true``), ``parallel_tool_calls=false``,
  ``stream_options=include_obfuscation``, ``modalities=audio``. A form without an entry has its
  field's level. :func:`request_forms` lists the forms a request uses.
- ``limits``: an upper bound per integer field the backend caps lower than the schema
  (TGI's ``top_logprobs`` <= 5), and ``exclusive``: field sets a backend refuses together
  (TGI's ``response_format`` + ``tools``).
- ``notes``: how a field (``user``) or a form (``tools=strict``) is honoured where its level alone
  does not say; the matrix footnotes them.

:meth:`ChatCapabilities.first_refusal` names the field to put in the 400 (``param``), the
key that matched (a field or a ``field=form``) and the reason to quote. Tables are built once
per backend type (per vLLM version and tool parser: cached), never per request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from functools import cached_property
from types import MappingProxyType
from typing import Any

from backends.capabilities import Capabilities, Level
from schemas.chat import ChatCompletionRequest
from schemas.chat_messages import FunctionTool, TextResponseFormat
from schemas.errors import UnsupportedParameterError
from schemas.vllm_extras import VLLM_EXTRAS_NEUTRAL

__all__ = [
    "CHAT_FIELDS",
    "CHAT_NEUTRAL_VALUES",
    "FORMS_NOTE",
    "OPENAI_ONLY_FIELDS",
    "VLLM_CHAT_EXTRAS",
    "ChatCapabilities",
    "Exclusive",
    "Refusal",
    "ValueRule",
    "request_forms",
]

N, T, E, U = Level.NATIVE, Level.TRANSLATED, Level.EMULATED, Level.UNSUPPORTED

CHAT_FIELDS: tuple[str, ...] = tuple(ChatCompletionRequest.model_fields)

# Fields only OpenAI's own API does anything with (pitfall 24: refused elsewhere, never dropped).
OPENAI_ONLY_FIELDS: frozenset[str] = frozenset(
    {
        "modalities", "verbosity", "web_search_options", "audio", "store", "prediction", "service_tier",
        "safety_identifier", "prompt_cache_key", "metadata", "functions", "function_call",
    }
)  # fmt: skip

VLLM_CHAT_EXTRAS: frozenset[str] = frozenset(CHAT_FIELDS[CHAT_FIELDS.index("echo") :])

# Values that mean "off": set explicitly, they are no violation on a backend without the feature.
CHAT_NEUTRAL_VALUES: Mapping[str, tuple[Any, ...]] = MappingProxyType(
    {
        "n": (1,), "logprobs": (False,), "store": (False,), "metadata": ({},), "logit_bias": ({},),
        "frequency_penalty": (0.0,), "presence_penalty": (0.0,), "echo": (False,),
        "add_generation_prompt": (True,), "continue_final_message": (False,), "add_special_tokens": (False,),
        "top_k": (-1, 0), "min_p": (0.0,), "repetition_penalty": (1.0,), "length_penalty": (1.0,),
        "stop_token_ids": ([],), "include_stop_str_in_output": (False,), "ignore_eos": (False,),
        "min_tokens": (0,), "skip_special_tokens": (True,), "spaces_between_special_tokens": (True,),
        "documents": ([],), "chat_template_kwargs": ({},), "modalities": (["text"],),
        "use_beam_search": (False,), "return_tokens_as_token_ids": (False,), "return_token_ids": (False,),
        "include_reasoning": (True,), "media_io_kwargs": ({},), "mm_processor_kwargs": ({},),
        **VLLM_EXTRAS_NEUTRAL,
    }
)  # fmt: skip


def request_forms(request: ChatCompletionRequest) -> Iterator[tuple[str, str]]:
    """``(field, form)`` for every value-level form the request uses (schema order, repeats possible)."""
    for message in request.messages:
        content = message.content  # every role has one (a getattr default would cost a raised AttributeError)
        if type(content) is list:  # (validated: a list is a list; isinstance is a call per message)
            for part in content:
                yield "messages", part.type
                if part.type == "image_url" and not part.image_url.url.startswith("data:"):
                    yield "messages", "remote_image_url"
    if request.modalities is not None and "audio" in request.modalities:
        yield "modalities", "audio"
    if request.response_format is not None:
        yield "response_format", request.response_format.type
    options = request.stream_options  # every bridged Responses stream sets it (usage for its last event)
    if options is not None:
        if options.include_usage is not None:  # (attributes, not a getattr loop: no call per option)
            yield "stream_options", "include_usage"
        if options.continuous_usage_stats is not None:
            yield "stream_options", "continuous_usage_stats"
        if options.include_obfuscation:  # false means "do not obfuscate": nothing to do
            yield "stream_options", "include_obfuscation"
    tools = request.tools
    if tools:
        for tool in tools:
            yield "tools", tool.type
    choice = request.tool_choice
    if choice is not None:  # (most requests have none: no isinstance call then)
        yield "tool_choice", choice if isinstance(choice, str) else choice.type
    if request.parallel_tool_calls is not None:
        yield "parallel_tool_calls", "true" if request.parallel_tool_calls else "false"
    # Last, so a table that refuses a tool_choice form names tool_choice first (as before strict had a form).
    if tools and any(isinstance(tool, FunctionTool) and tool.function.strict for tool in tools):
        yield "tools", "strict"


def _is_neutral(field: str, value: Any) -> bool:
    if field == "response_format" and isinstance(value, TextResponseFormat):
        return True  # plain text is every backend's default: nothing to honour
    # Validation is strict, so a bool never stands for an int here and ``==`` is exact enough.
    return value is None or any(value == candidate for candidate in CHAT_NEUTRAL_VALUES.get(field, ()))


# A request's note of the table that passed it last, in its private slot: (the table, the request's
# field values). The check is a pure function of the two, and a table is frozen data (another vLLM
# version or tool parser is another table), so the same table passes the same request again: the
# send-time check of an adapter whose table can change (vLLM's) or that may be called unrouted (the
# native translators') costs nothing after the router's while the route's table is still the one
# routing checked, and runs in full when it is not (a version read between routing and sending, a
# failover to another backend's table). A request is frozen and nothing on the path edits its values
# in place; a copy with changed fields (``model_copy``, which copies the private slot) has a values
# dict of its own, so the note never vouches for it.
_PASSED = "chat_capabilities_passed"
# A request's forms as the code that built it recorded them, in its private slot: (the request's field
# values, the forms :func:`request_forms` yields, in its order, each once). The chat bridge records
# them as it builds a translation (backends.responses.plain_chat), so the check reads the few forms
# it made rather than walking the messages and tools again; the first refused form is the same
# (tests/backends/responses/test_plain_chat.py holds the record to the walk). As for ``_PASSED``, a
# copy with other values (its own values dict) is walked.
FORMS_NOTE = "chat_capabilities_forms"


@dataclass(frozen=True, slots=True)
class Exclusive:
    """Fields a backend refuses together; the refusal names the last of them the request sets."""

    fields: tuple[str, ...]
    why: str


@dataclass(frozen=True, slots=True)
class ValueRule:
    """A refusal that depends on a field's value (a version's bound on it): ``applies(request)``
    -> refuse ``field`` with ``why``. Checked last, one predicate per rule (a table has few)."""

    field: str
    why: str
    applies: Callable[[ChatCompletionRequest], bool]


@dataclass(frozen=True, slots=True)
class Refusal:
    param: str  # the request field to name in the 400
    key: str  # what matched: the field, ``field=form``, ``field>limit`` or ``a+b``
    why: str | None  # the reason to quote, when more can be said than "not by this backend"


@dataclass(frozen=True)
class ChatCapabilities:
    """A backend type's chat table; build with :meth:`build`."""

    fields: Capabilities
    forms: Mapping[str, Level] = dataclass_field(default_factory=lambda: MappingProxyType({}))
    limits: Mapping[str, int] = dataclass_field(default_factory=lambda: MappingProxyType({}))
    exclusive: tuple[Exclusive, ...] = ()
    reasons: Mapping[str, str] = dataclass_field(default_factory=lambda: MappingProxyType({}))
    # How a form is honoured where its level alone does not say (``tools=strict``: by which grammar).
    form_notes: Mapping[str, str] = dataclass_field(default_factory=lambda: MappingProxyType({}))
    rules: tuple[ValueRule, ...] = ()

    @classmethod
    def build(
        cls,
        default: Level,
        levels: Mapping[str, Level],
        forms: Mapping[str, Level] | None = None,
        *,
        limits: Mapping[str, int] | None = None,
        exclusive: tuple[Exclusive, ...] = (),
        reasons: Mapping[str, str] | None = None,
        notes: Mapping[str, str] | None = None,
        rules: tuple[ValueRule, ...] = (),
    ) -> ChatCapabilities:
        unknown = set(levels) - set(CHAT_FIELDS)
        unknown |= {key.split("=")[0] for key in forms or {}} - set(CHAT_FIELDS)
        unknown |= set(limits or {}) - set(CHAT_FIELDS)
        field_notes = {key: note for key, note in (notes or {}).items() if "=" not in key}
        form_notes = {key: note for key, note in (notes or {}).items() if "=" in key}
        unknown |= {key.split("=")[0] for key in form_notes} - set(CHAT_FIELDS)
        unknown |= {rule.field for rule in rules} - set(CHAT_FIELDS)
        if unknown:
            raise ValueError(f"unknown chat request fields: {sorted(unknown)}")
        table = {name: levels.get(name, default) for name in CHAT_FIELDS}
        unsupported = frozenset(name for name, level in table.items() if level is U)
        return cls(
            Capabilities(MappingProxyType(table), unsupported).with_notes(field_notes),
            MappingProxyType(dict(forms or {})),
            MappingProxyType(dict(limits or {})),
            exclusive,
            MappingProxyType(dict(reasons or {})),
            MappingProxyType(form_notes),
            rules,
        )

    def note(self, field: str, form: str | None = None) -> str | None:
        """How ``field`` (or its ``form``) is honoured here, where the level alone does not say."""
        if form is not None:
            return self.form_notes.get(f"{field}={form}")
        return self.fields.notes.get(field)

    def level(self, field: str, form: str | None = None) -> Level:
        if form is not None and (level := self.forms.get(f"{field}={form}")) is not None:
            return level
        return self.fields.level(field)

    def first_refusal(self, request: ChatCompletionRequest) -> Refusal | None:
        """The first thing the request asks that this backend cannot honour, if any.

        Order: unsupported fields (schema order), then forms, limits, exclusive sets and value rules.
        Cost: a set intersection plus one walk over the request's forms (a handful). A request this
        very table passed before is passed again at once (see ``_PASSED``).
        """
        state: dict[str, Any] | None = request.__pydantic_private__
        if state is not None and _PASSED in state:
            table, values = state[_PASSED]
            if table is self and values is request.__dict__:
                return None
        fields_set = request.__pydantic_fields_set__  # (model_fields_set is a property: a call per read)
        touched = self.fields.unsupported.intersection(fields_set)
        if touched:  # most requests set none of them: no walk over every chat field then
            for name in CHAT_FIELDS:
                if name in touched and not _is_neutral(name, getattr(request, name)):
                    return Refusal(name, name, self.reasons.get(name))
        if not self._refused_form_fields.isdisjoint(fields_set):  # else no form can be refused
            note = state.get(FORMS_NOTE) if state is not None else None
            forms = note[1] if note is not None and note[0] is request.__dict__ else request_forms(request)
            for name, form in forms:
                key = f"{name}={form}"
                if self.forms.get(key) is U:
                    return Refusal(name, key, self.reasons.get(key))
        for name, limit in self.limits.items():
            value = getattr(request, name)
            if isinstance(value, int) and (value > limit or value < 0 <= limit):  # -1 ("all") is over any limit
                return Refusal(name, f"{name}>{limit}", self.reasons.get(f"{name}>{limit}"))
        for rule in self.exclusive:
            present = [
                f for f in rule.fields if getattr(request, f) is not False and not _is_neutral(f, getattr(request, f))
            ]
            if len(present) == len(rule.fields):
                return Refusal(present[-1], "+".join(rule.fields), rule.why)
        for value_rule in self.rules:
            if value_rule.applies(request):
                return Refusal(value_rule.field, value_rule.field, value_rule.why)
        if state is None:  # (a client's request: its private slot is made here, on a frozen model)
            object.__setattr__(request, "__pydantic_private__", {_PASSED: (self, request.__dict__)})
        else:
            state[_PASSED] = (self, request.__dict__)
        return None

    @cached_property
    def _refused_form_fields(self) -> frozenset[str]:
        """The fields with a form this backend refuses (``stream_options`` on OpenAI): a request that
        sets none of them needs no walk over its forms (issue 14: chat's cost per request)."""
        return frozenset(key.split("=", 1)[0] for key, level in self.forms.items() if level is U)

    def refusal(self, request: ChatCompletionRequest, backend: str, kind: str) -> UnsupportedParameterError | None:
        """The 400 for the first thing this backend cannot honour (None: it can serve the request),
        built by the one refusal constructor (:meth:`Capabilities.refusal_error`)."""
        refusal = self.first_refusal(request)
        if refusal is None:
            return None
        what = None if refusal.key == refusal.param else _describe(refusal)
        why = refusal.why
        if why is None and ">" in refusal.key:
            why = f"at most {refusal.key.split('>', 1)[1]} on this backend"
        return Capabilities.refusal_error(refusal.param, backend, kind, why, what=what)

    def rows(self) -> Iterator[tuple[str, Level]]:
        """Every field, then every form, with its level (for the README's matrix)."""
        for name in CHAT_FIELDS:
            yield name, self.fields.level(name)
        yield from sorted(self.forms.items())


def _describe(refusal: Refusal) -> str:
    """What was refused, for the message: ``tool_choice=required`` -> ``tool_choice "required"``."""
    key = refusal.key
    if "=" in key:
        name, form = key.split("=", 1)
        return f'{name} "{form}"'
    if ">" in key:
        name, limit = key.split(">", 1)
        return f"{name} above {limit}"
    return " together with ".join(key.split("+"))
