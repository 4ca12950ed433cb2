"""The stored-response endpoints' wire: query parameters and answers.

``GET /v1/responses/{id}`` (:class:`RetrieveQuery`), ``DELETE /v1/responses/{id}``
(:class:`ResponseDeleted`), ``GET /v1/responses/{id}/input_items`` (:class:`InputItemsQuery`,
answered with an :class:`InputItemList`, a page of OpenAI's cursor lists). Query values arrive
as strings; the models convert them (``"20"``, ``"true"``) and refuse unknown names.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from schemas.responses import Includable

__all__ = ["INCLUDABLE", "InputItemList", "InputItemsQuery", "ResponseDeleted", "RetrieveQuery"]

INCLUDABLE: tuple[str, ...] = get_args(Includable)

_ItemId = Annotated[str, Field(min_length=1, max_length=256)]


class _Query(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RetrieveQuery(_Query):
    """``GET /v1/responses/{id}``. A stored response is returned as it was answered (with what its
    request's ``include`` asked for); replaying it as events (``stream``) is refused by name."""

    include: list[Includable] | None = None
    include_obfuscation: bool | None = None  # only changes streamed events
    stream: bool | None = None
    starting_after: Annotated[int, Field(ge=0)] | None = None


class InputItemsQuery(_Query):
    """``GET /v1/responses/{id}/input_items``: a page of the response's input items."""

    after: _ItemId | None = None  # list the items after this one (in ``order``)
    before: _ItemId | None = None  # list the items before this one (in ``order``)
    include: list[Includable] | None = None
    limit: Annotated[int, Field(ge=1, le=100)] = 20
    order: Literal["asc", "desc"] = "desc"


class InputItemList(BaseModel):
    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool


class ResponseDeleted(BaseModel):
    id: str
    object: Literal["response.deleted"] = "response.deleted"
    deleted: Literal[True] = True
