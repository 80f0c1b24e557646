"""llama.cpp in-process through llama-cpp-python.

- engine.py: LlamaCppEngine, loading (loading.py) and the three modes below;
- batched.py, batch_decoder.py: continuous batching, one context of many sequences;
- per_slot.py: one context per slot (config `batching: false`);
- prefix_cache.py: which slot a request takes and the cached cells it starts from (both modes);
- embedding.py: embeddings only (config `embedding: true`);
- plan.py, json_grammar.py: a request's biases and grammar; choice_text.py: tokens -> deltas;
- lowlevel.py: the one module that touches llama-cpp-python's private API.
"""

from laneway.engines.llamacpp.engine import CAPABILITIES, OFF_LOOP_PROMPT_CHARS, LlamaCppEngine

__all__ = ["CAPABILITIES", "OFF_LOOP_PROMPT_CHARS", "LlamaCppEngine"]
