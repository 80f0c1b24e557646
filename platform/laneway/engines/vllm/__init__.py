"""vLLM through its OpenAI-compatible HTTP server: engine.py (the adapter), request_body.py
(what is sent), answers.py (what is read back), prometheus.py (its load, from /metrics)."""

from laneway.engines.vllm.engine import CAPABILITIES, VLLMEngine
from laneway.engines.vllm.prometheus import parse_prometheus

__all__ = ["CAPABILITIES", "VLLMEngine", "parse_prometheus"]
