#!/usr/bin/env bash
# vLLM for the interactive lane: small batches, chunked prefill with a small token budget so a
# long prompt never stalls decode for long, priority scheduling for laneway's priority hint.
# MODEL, NAME (the served model name a deployment's config names), PORT and MAX_MODEL_LEN
# override the defaults; further arguments go to `vllm serve`. docs/engines/README.md has the
# matching `laneway model set`.
set -euo pipefail
exec vllm serve "${MODEL:-meta-llama/Llama-3.1-8B-Instruct}" --served-model-name "${NAME:-chat}" \
  --port "${PORT:-8001}" --max-model-len "${MAX_MODEL_LEN:-8192}" \
  --max-num-seqs 64 --max-num-batched-tokens 2048 --enable-chunked-prefill \
  --scheduling-policy priority --gpu-memory-utilization 0.90 "$@"
