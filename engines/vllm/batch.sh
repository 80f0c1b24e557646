#!/usr/bin/env bash
# vLLM for the batch lane: throughput first, big batches, long contexts, prefix caching.
# MODEL, NAME (the served model name a deployment's config names), PORT and MAX_MODEL_LEN
# override the defaults; further arguments go to `vllm serve`. docs/engines/README.md has the
# matching `laneway model set`.
set -euo pipefail
exec vllm serve "${MODEL:-meta-llama/Llama-3.1-8B-Instruct}" --served-model-name "${NAME:-chat}" \
  --port "${PORT:-8002}" --max-model-len "${MAX_MODEL_LEN:-32768}" \
  --max-num-seqs 256 --max-num-batched-tokens 16384 --enable-chunked-prefill \
  --enable-prefix-caching --gpu-memory-utilization 0.95 "$@"
