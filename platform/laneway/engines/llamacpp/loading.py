"""Loading a GGUF model into `Llama` contexts (in a worker thread: it takes seconds)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from laneway.engines.llamacpp.embedding import POOLING_NONE, POOLING_RANK, POOLING_TYPES, POOLING_UNSPECIFIED


def load_contexts(
    path: Path, count: int, *, n_ctx: int, n_threads: int, n_gpu_layers: int, embedding: bool, pooling: int
) -> list[Any]:
    """`count` contexts on the model at `path`. With `embedding`, an embedding context pools
    as `pooling` says, or as the model declares, or (a model that declares none) by the mean,
    since OpenAI gives one vector per input; a reranker's pooling is refused (ValueError)."""
    from llama_cpp import Llama

    # An embedding is pooled over one batch: a whole input (up to the context) in one ubatch.
    n_batch = n_ctx if embedding else min(512, n_ctx)
    n_ubatch = n_ctx if embedding else 512

    def context(pooling: int) -> Any:
        return Llama(
            model_path=str(path),
            n_ctx=n_ctx,
            n_threads=n_threads,
            n_gpu_layers=n_gpu_layers,
            n_batch=n_batch,
            n_ubatch=n_ubatch,
            verbose=False,
            embedding=embedding,
            pooling_type=pooling,
        )

    contexts = [context(pooling)]
    if embedding:
        declared = contexts[0].pooling_type()
        if declared == POOLING_NONE and pooling == POOLING_UNSPECIFIED:  # no pooling of its own: mean
            contexts[0].close()
            pooling = POOLING_TYPES["mean"]
            contexts = [context(pooling)]
        elif declared == POOLING_RANK:
            contexts[0].close()
            raise ValueError("the model pools for ranking (a reranker); set `pooling` to embed with it")
    return contexts + [context(pooling) for _ in range(count - 1)]
