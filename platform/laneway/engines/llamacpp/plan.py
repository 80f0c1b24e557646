"""What one request's decoding needs beyond the defaults: its logit biases, its grammar (a
required tool call or a JSON answer) and whether its answer is held back to be read as tool
calls. Built before a slot is taken, so a bad token id or schema is the client's error."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from laneway.engines.base import EngineRequestError
from laneway.engines.llamacpp.json_grammar import json_grammar
from laneway.engines.tool_calls import call_schema, offered, output_schema
from laneway.types import GenerationRequest


@dataclass(frozen=True, slots=True)
class DecodePlan:
    bias_ids: np.ndarray
    bias_vals: np.ndarray
    grammar: Any  # a LlamaGrammar, or None
    mode: str  # "text" | "tools" (a call is required) | "auto" (the model may call a tool)
    tools: list[dict[str, Any]]
    # The request's sampling extensions (core/capabilities.py checked them), in llama.cpp's terms.
    top_k: int = 0  # 0: off
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    # End-of-generation tokens are masked for a choice's first `hold_eog` tokens: min_tokens,
    # or every token for ignore_eos (llama.cpp's server does ignore_eos the same way).
    hold_eog: int = 0
    eog_ids: np.ndarray | None = None


@dataclass(frozen=True, slots=True)
class TokenBiases:
    """The deployment's own logit biases (banned tokens at -inf), as sorted parallel arrays."""

    ids: np.ndarray
    values: np.ndarray

    @classmethod
    def of(cls, bias: Mapping[int, float], banned: Iterable[int]) -> TokenBiases:
        merged = dict(bias)
        for tok in banned:
            merged[tok] = -float("inf")
        return cls._sorted(merged)

    @classmethod
    def _sorted(cls, merged: Mapping[int, float]) -> TokenBiases:
        order = sorted(merged)
        return cls(np.array(order, dtype=np.int64), np.array([merged[i] for i in order], dtype=np.float32))

    def with_request(self, requested: Mapping[int, float], n_vocab: int) -> TokenBiases:
        """These biases with a request's own (a banned token stays banned)."""
        merged = dict(zip(self.ids.tolist(), self.values.tolist(), strict=True))
        for tok, value in requested.items():
            if not 0 <= tok < n_vocab:
                raise EngineRequestError(f"logit_bias: token id {tok} is not in the vocabulary (0-{n_vocab - 1})")
            if merged.get(tok) != -float("inf"):
                merged[tok] = float(value)
        return self._sorted(merged)


IGNORE_EOS = 2**62  # hold_eog for ignore_eos: no choice is that long


def decode_plan(req: GenerationRequest, biases: TokenBiases, n_vocab: int, eog_ids: np.ndarray) -> DecodePlan:
    if req.logit_bias:
        biases = biases.with_request(req.logit_bias, n_vocab)
    tools = offered(req.tools, req.tool_choice)
    schema: dict[str, Any] | None = None
    mode = "text"
    if tools and req.tool_choice not in (None, "auto"):  # "required" or a named function
        schema, mode = call_schema(tools, req.parallel_tool_calls), "tools"
    elif tools:
        mode = "auto"
    else:
        schema = output_schema(req.response_format)
    # Key order is kept: the grammar writes the keys in it (a call's name before its arguments).
    grammar = json_grammar(json.dumps(schema)) if schema is not None else None
    ext = req.extensions
    if ext is None:
        return DecodePlan(biases.ids, biases.values, grammar, mode, tools)
    hold = IGNORE_EOS if ext.ignore_eos else (ext.min_tokens or 0)
    return DecodePlan(
        biases.ids,
        biases.values,
        grammar,
        mode,
        tools,
        top_k=max(ext.top_k or 0, 0),
        min_p=ext.min_p or 0.0,
        repeat_penalty=ext.repetition_penalty or 1.0,
        hold_eog=hold,
        eog_ids=eog_ids if hold else None,
    )
