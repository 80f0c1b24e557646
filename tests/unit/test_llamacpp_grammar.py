"""The JSON grammar patch (engines/llamacpp/json_grammar.py): a string may not hold raw
control characters, and a converter that words its string rule another way is an error, not
a patch that silently does nothing."""

from __future__ import annotations

import json

import pytest
from laneway.engines.base import EngineRequestError
from laneway.engines.llamacpp.json_grammar import (
    JSON_CHAR,
    LAX_CHAR,
    GrammarPatchError,
    json_grammar,
    strict_json_gbnf,
)

grammar_module = pytest.importorskip("llama_cpp.llama_grammar")

WITH_STRINGS = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def test_the_installed_converter_writes_the_rule_the_patch_replaces() -> None:
    gbnf = grammar_module.json_schema_to_gbnf(json.dumps(WITH_STRINGS))
    assert LAX_CHAR in gbnf  # else the patch has nothing to do: see json_grammar.py
    patched = strict_json_gbnf(gbnf)
    assert JSON_CHAR in patched and LAX_CHAR not in patched
    assert patched.replace(JSON_CHAR, LAX_CHAR) == gbnf  # nothing else touched
    assert strict_json_gbnf(patched) == patched  # strict already: left alone


def test_a_grammar_without_strings_needs_no_patch() -> None:
    for schema in ({"type": "integer"}, {"type": "array", "items": {"type": "number"}}):
        gbnf = grammar_module.json_schema_to_gbnf(json.dumps(schema))
        assert "char ::=" not in gbnf and strict_json_gbnf(gbnf) == gbnf


@pytest.mark.parametrize(
    "gbnf",
    [
        'char ::= [^"\\\\\\x7F] | "\\\\" (["\\\\/bfnrt])\nroot ::= "\\"" char* "\\""',  # reworded
        'chr ::= [^"\\\\] | "\\\\" (["\\\\/bfnrt])\nroot ::= "\\"" chr* "\\""',  # renamed
    ],
)
def test_a_converter_that_words_the_rule_otherwise_is_refused(gbnf: str) -> None:
    with pytest.raises(GrammarPatchError):
        strict_json_gbnf(gbnf)


def test_json_grammar_fails_as_the_engines_fault_when_the_rule_is_not_found(monkeypatch: pytest.MonkeyPatch) -> None:
    reworded = 'char ::= [^"] | "\\\\" ["]\nroot ::= "\\"" char* "\\"" space\nspace ::= " "?'
    monkeypatch.setattr(grammar_module, "json_schema_to_gbnf", lambda schema: reworded)
    with pytest.raises(GrammarPatchError) as raised:
        json_grammar(json.dumps({"type": "string", "title": "not cached"}))
    assert not isinstance(raised.value, EngineRequestError)  # a 5xx engine error, not the client's 400


def test_the_patched_grammar_compiles() -> None:
    assert json_grammar(json.dumps(WITH_STRINGS)) is not None
