"""Pydantic models made from values known to be valid for them, through BaseModel's own slots.

A model validation made is an object whose ``__dict__`` holds every field's value (in declared order),
whose ``__pydantic_fields_set__`` names the fields given, and whose ``__pydantic_extra__`` and
``__pydantic_private__`` are None until something is kept there; ``model_construct`` sets the same
four, but walks every declared field. The bridge's translations (:mod:`backends.responses.plain_chat`,
:mod:`backends.responses.chat_tools`) set them through the slots' own descriptors: object.__setattr__
looks each name up in the type first (a third of a small model's making).
"""

from __future__ import annotations

from pydantic import BaseModel

__all__ = ["new", "set_dict", "set_extra", "set_fields_set", "set_private"]

_SLOTS = BaseModel.__dict__
set_dict = _SLOTS["__dict__"].__set__
set_fields_set = _SLOTS["__pydantic_fields_set__"].__set__
set_extra = _SLOTS["__pydantic_extra__"].__set__
set_private = _SLOTS["__pydantic_private__"].__set__
new = object.__new__
