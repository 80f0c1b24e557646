"""JSON schemas as llama.cpp grammars, with the string rule made as strict as JSON.

llama-cpp-python's converter lets a JSON string hold raw control characters (a newline),
which no JSON parser accepts; llama.cpp's own converter excludes them. The converter's
output is patched here, and the patch checks that it found what it patches: if a release
words the string rule another way, every constrained request fails with GrammarPatchError
(and the contract test in tests/unit/test_llamacpp_internals.py fails first) instead of the
patch silently doing nothing.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from laneway.engines.base import EngineError, EngineRequestError

LAX_CHAR = r'char ::= [^"\\] |'
JSON_CHAR = r'char ::= [^"\\\x7F\x00-\x1F] |'
# A string's character class as the lax rule writes it, wherever it stands.
_LAX_CLASS = r'[^"\\] '
_CHAR_RULE = re.compile(r"^char ::= .*$", re.MULTILINE)


class GrammarPatchError(EngineError):
    """llama-cpp-python's JSON grammar no longer has the rule laneway patches: the engine's fault."""


def strict_json_gbnf(gbnf: str) -> str:
    """`gbnf` (json_schema_to_gbnf's output) with its `char` rule excluding control
    characters. A grammar without strings has no such rule and is returned as it is."""
    rule = _CHAR_RULE.search(gbnf)
    if rule is None:
        if _LAX_CLASS in gbnf:  # strings, under a rule of another name
            raise GrammarPatchError("llama-cpp-python's JSON grammar has strings but no `char` rule to make strict")
        return gbnf
    if rule[0].startswith(JSON_CHAR):  # strict already
        return gbnf
    if not rule[0].startswith(LAX_CHAR):
        raise GrammarPatchError(f"llama-cpp-python's JSON grammar words its `char` rule differently: {rule[0]!r}")
    return gbnf[: rule.start()] + JSON_CHAR + gbnf[rule.start() + len(LAX_CHAR) :]


@lru_cache(maxsize=64)
def json_grammar(schema_json: str) -> Any:
    """A schema's LlamaGrammar, built once: converting a JSON schema to GBNF costs milliseconds."""
    from llama_cpp.llama_grammar import LlamaGrammar, json_schema_to_gbnf

    try:
        gbnf = json_schema_to_gbnf(schema_json)
    except Exception as exc:  # the converter raises plain exceptions on schemas it cannot express
        raise EngineRequestError(f"the JSON schema cannot be used to constrain the output: {exc}") from exc
    gbnf = strict_json_gbnf(gbnf)
    try:
        return LlamaGrammar.from_string(gbnf, verbose=False)
    except Exception as exc:
        raise EngineRequestError(f"the JSON schema cannot be used to constrain the output: {exc}") from exc
