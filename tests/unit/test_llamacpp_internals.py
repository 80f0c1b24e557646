"""The contract with llama-cpp-python's private API (engines/llamacpp/lowlevel.py, the fence):
every class, method, attribute and struct field laneway touches there, with the parameters it
passes, as the pinned release has them. A release that changes any of it fails here, before a
deployment meets it (docs/decisions/0003-llama-cpp-internals.md).

And the fence itself: no other module of laneway imports `llama_cpp._internals` or reads a
`Llama`'s private `_model`."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

llama_cpp = pytest.importorskip("llama_cpp")

PACKAGE = Path(__file__).resolve().parents[2] / "platform" / "laneway"
FENCE = PACKAGE / "engines" / "llamacpp" / "lowlevel.py"


def parameters(fn: Callable[..., Any]) -> list[tuple[str, str]]:
    """(name, kind) of each parameter, kinds as inspect names them (KEYWORD_ONLY...)."""
    return [(p.name, p.kind.name) for p in inspect.signature(fn).parameters.values()]


POS = "POSITIONAL_OR_KEYWORD"
KW = "KEYWORD_ONLY"
ONLY = "POSITIONAL_ONLY"


def test_the_private_wrappers_take_what_lowlevel_passes() -> None:
    from llama_cpp import _internals as internals

    context, batch, sampler, model = (
        internals.LlamaContext,
        internals.LlamaBatch,
        internals.LlamaSampler,
        internals.LlamaModel,
    )
    expected: list[tuple[Callable[..., Any], list[tuple[str, str]]]] = [
        (context.__init__, [("self", POS), ("model", KW), ("params", KW), ("verbose", KW)]),
        (context.kv_cache_seq_rm, [("self", POS), ("seq_id", POS), ("p0", POS), ("p1", POS)]),
        (context.kv_cache_seq_cp, [("self", POS), ("seq_id_src", POS), ("seq_id_dst", POS), ("p0", POS), ("p1", POS)]),
        (context.decode, [("self", POS), ("batch", POS)]),
        (context.get_logits_ith, [("self", POS), ("i", POS)]),
        (context.close, [("self", POS)]),
        (batch.__init__, [("self", POS), ("n_tokens", KW), ("embd", KW), ("n_seq_max", KW), ("verbose", KW)]),
        (batch.close, [("self", POS)]),
        (sampler.__init__, [("self", POS)]),
        (sampler.add_logit_bias, [("self", POS), ("n_vocab", POS), ("logit_bias", POS)]),
        (
            sampler.add_penalties,
            [
                ("self", POS),
                ("n_vocab", POS),
                ("penalty_last_n", POS),
                ("penalty_repeat", POS),
                ("penalty_freq", POS),
                ("penalty_present", POS),
            ],
        ),
        (sampler.add_grammar, [("self", POS), ("model", POS), ("grammar", POS)]),
        (sampler.add_greedy, [("self", POS)]),
        (sampler.add_top_k, [("self", POS), ("k", POS)]),
        (sampler.add_top_p, [("self", POS), ("p", POS), ("min_keep", POS)]),
        (sampler.add_min_p, [("self", POS), ("p", POS), ("min_keep", POS)]),
        (sampler.add_temp, [("self", POS), ("temp", POS)]),
        (sampler.add_dist, [("self", POS), ("seed", POS)]),
        (sampler.sample, [("self", POS), ("ctx", POS), ("idx", POS)]),
        (model.detokenize, [("self", POS), ("tokens", POS), ("special", POS)]),
        # The public bindings lowlevel.py calls on the private wrappers' handles.
        (llama_cpp.llama_memory_seq_pos_max, [("mem", ONLY), ("seq_id", ONLY)]),
        (llama_cpp.llama_n_seq_max, [("ctx", ONLY)]),
    ]
    changed = {fn.__qualname__: parameters(fn) for fn, want in expected if parameters(fn) != want}
    assert not changed, f"llama-cpp-python changed what engines/llamacpp/lowlevel.py calls: {changed}"


def test_the_structs_lowlevel_fills_have_their_fields() -> None:
    batch_fields = {name for name, _ in llama_cpp.llama_batch._fields_}
    assert {"n_tokens", "token", "pos", "n_seq_id", "seq_id", "logits"} <= batch_fields
    params = {name for name, _ in llama_cpp.llama_context_params._fields_}
    assert {"n_ctx", "n_seq_max", "n_batch", "n_ubatch", "n_threads", "n_threads_batch"} <= params


def test_a_loaded_model_has_the_private_attributes_lowlevel_reads(demo_model_path: Path) -> None:
    from laneway.engines.llamacpp.lowlevel import BatchContext, Sampler
    from llama_cpp import _internals as internals

    llama = llama_cpp.Llama(model_path=str(demo_model_path), n_ctx=64, verbose=False)
    try:
        assert isinstance(llama._model, internals.LlamaModel)
        ctx = BatchContext(llama, sequences=3, n_ctx=64, n_batch=16, n_threads=1)
        try:  # the wrappers' handles (LlamaContext.ctx and .memory, LlamaBatch.batch) work
            assert ctx.sequences == 3 and ctx.last_position(0) == -1
            for i, tok in enumerate(llama.tokenize(b"hello world", add_bos=True)):
                ctx.add(i, tok, i, 1, logits=True)
            ctx.decode(i + 1)
            assert ctx.last_position(1) == i
            ctx.copy(1, 2)
            ctx.drop(1)
            assert ctx.last_position(1) == -1 and ctx.last_position(2) == i
            sampler = Sampler(
                ctx,
                biases={5: 1.0},
                penalty_last_n=64,
                frequency_penalty=0.5,
                presence_penalty=0.5,
                grammar=None,
                temperature=0.7,
                top_p=0.9,
                seed=1,
            )
            assert 0 <= sampler.sample(i) < ctx.n_vocab
            assert isinstance(ctx.piece(sampler.sample(i)), bytes)
        finally:
            ctx.close()
    finally:
        llama.close()


def test_the_public_llama_calls_take_the_keywords_laneway_passes() -> None:
    from llama_cpp.llama_grammar import LlamaGrammar, json_schema_to_gbnf

    llama = llama_cpp.Llama
    used: dict[Callable[..., Any], set[str]] = {
        llama.__init__: {
            "model_path",
            "n_ctx",
            "n_threads",
            "n_gpu_layers",
            "n_batch",
            "n_ubatch",
            "verbose",
            "embedding",
            "pooling_type",
        },
        llama.tokenize: {"text", "add_bos", "special"},
        llama.detokenize: {"tokens"},
        llama.generate: {
            "tokens",
            "temp",
            "top_p",
            "top_k",
            "min_p",
            "reset",
            "frequency_penalty",
            "presence_penalty",
            "logits_processor",
            "grammar",
        },
        llama.set_seed: {"seed"},
        llama.embed: {"input", "truncate", "return_count"},
        json_schema_to_gbnf: {"schema"},
        LlamaGrammar.from_string: {"grammar", "verbose"},
    }
    missing = {fn.__qualname__: want - set(inspect.signature(fn).parameters) for fn, want in used.items()}
    assert not any(missing.values()), missing


def _private_uses(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and "_internals" in node.module.split("."):
            found.append(f"{path.name}:{node.lineno} imports {node.module}")
        if isinstance(node, ast.Import) and any("_internals" in a.name.split(".") for a in node.names):
            found.append(f"{path.name}:{node.lineno} imports _internals")
        if isinstance(node, ast.Attribute) and node.attr == "_model":
            found.append(f"{path.name}:{node.lineno} reads ._model")
    return found


def test_only_the_fence_touches_llama_cpps_private_api() -> None:
    assert _private_uses(FENCE), "the fence no longer uses the private API: drop it, its pin and this test"
    outside = [use for path in PACKAGE.rglob("*.py") if path != FENCE for use in _private_uses(path)]
    assert not outside, outside
