"""FieldRules (schemas/common.py): the rules a set of touched fields calls, in order, whether worked out
now or kept from an earlier request with the same set, and past the bound on kept sets."""

from __future__ import annotations

from itertools import combinations

import pytest

import schemas.common as common
from schemas.common import FieldRules


def rules(ran: list[str]) -> FieldRules[object]:
    return FieldRules(
        (frozenset({"a"}), lambda _m: ran.append("A")),
        (frozenset({"b", "c"}), lambda _m: ran.append("BC")),
        (frozenset({"a", "c"}), lambda _m: ran.append("AC")),
    )


WANT = {
    (): [], ("a",): ["A", "AC"], ("b",): ["BC"], ("c",): ["BC", "AC"], ("a", "b"): ["A", "BC", "AC"],
    ("a", "c"): ["A", "BC", "AC"], ("b", "c"): ["BC", "AC"], ("a", "b", "c"): ["A", "BC", "AC"],
}  # fmt: skip


@pytest.mark.parametrize("bound", [1024, 2])
def test_each_set_calls_its_rules_in_order_every_time(monkeypatch: pytest.MonkeyPatch, bound: int) -> None:
    monkeypatch.setattr(common, "_MAX_CHOSEN", bound)  # 2: most sets are worked out on every request
    ran: list[str] = []
    field_rules = rules(ran)
    for _ in range(2):  # the second round: the kept choices (those the bound let in)
        for size in range(4):
            for touched in combinations("abc", size):
                ran.clear()
                field_rules.run(object(), {*touched, "unrelated"})
                assert ran == WANT[touched], touched
