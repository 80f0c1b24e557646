"""The save-time checks on fallback aliases, without a database: loops of any length refused
with the entry named, shared fallbacks (a diamond) allowed."""

from __future__ import annotations

import pytest
from laneway.admin.fallbacks import check_fallbacks, split_aliases
from laneway.contracts.errors import GatewayError

GRAPH = {"a": [], "b": ["c"], "c": ["d"], "d": [], "e": []}


def refusal(alias: str, fallbacks: list[str]) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        check_fallbacks(GRAPH, alias, fallbacks)
    assert caught.value.status == 400
    return caught.value


def test_a_diamond_is_no_loop() -> None:
    check_fallbacks(GRAPH, "a", ["b", "c", "d"])  # a -> b -> c -> d, and a -> c, a -> d directly
    check_fallbacks({**GRAPH, "e": ["c"]}, "a", ["e", "b"])
    check_fallbacks(GRAPH, "a", [])


def test_loops_of_any_length_are_named_by_their_entry() -> None:
    error = refusal("d", ["e", "b"])  # d -> b -> c -> d
    assert error.param == "fallbacks[1]" and error.message.endswith("would make a loop: d -> b -> c -> d.")
    assert refusal("c", ["b"]).message.endswith("c -> b -> c.")
    assert refusal("a", ["a"]).param == "fallbacks[0]"


def test_unknown_and_repeated_aliases_are_refused() -> None:
    assert refusal("a", ["b", "zz"]).param == "fallbacks[1]"
    assert refusal("a", ["d", "b", "d"]).param == "fallbacks[2]"


def test_a_typed_list_is_split_on_commas_and_none_clears_it() -> None:
    assert split_aliases(" b, c ,,d ") == ["b", "c", "d"]
    assert split_aliases("") == split_aliases("None") == []
