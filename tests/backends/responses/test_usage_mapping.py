"""Chat usage in Responses' names (backends/responses/answer.py responses_usage): the details each
upstream gives, or none, or ones that are not what they should be."""

from __future__ import annotations

from typing import Any

import pytest

from backends.base import usage_of
from backends.responses.answer import responses_usage

_BASE = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}


@pytest.mark.parametrize(
    ("extra", "cached", "reasoning"),
    [
        ({}, 0, 0),
        ({"prompt_tokens_details": {"cached_tokens": 5}}, 5, 0),
        ({"completion_tokens_details": {"reasoning_tokens": 2}}, 0, 2),
        ({"prompt_tokens_details": {"cached_tokens": 5}, "completion_tokens_details": {"reasoning_tokens": 2}}, 5, 2),
        ({"prompt_tokens_details": None, "completion_tokens_details": {"reasoning_tokens": "2"}}, 0, 0),
        ({"prompt_tokens_details": {"audio_tokens": 1}, "completion_tokens_details": []}, 0, 0),
    ],
)
def test_usage_details_are_mapped_when_given_and_zero_otherwise(
    extra: dict[str, Any], cached: int, reasoning: int
) -> None:
    usage = {**_BASE, **extra}
    expected = {
        "input_tokens": 7,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": 3,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": 10,
    }
    assert responses_usage(usage) == expected
    assert responses_usage(usage, usage_of(usage)) == expected


def test_no_usage_maps_to_none_and_counts_alone_to_zero_details() -> None:
    assert responses_usage(None) is None and responses_usage({"prompt_tokens": "x"}) is None
    counts = usage_of(_BASE)
    mapped = responses_usage("not a dict", counts)
    assert mapped is not None and mapped["input_tokens_details"] == {"cached_tokens": 0}
