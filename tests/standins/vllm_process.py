"""The vLLM stand-in as a process of its own, for tests that kill a replica (SIGKILL):

    python tests/standins/vllm_process.py PORT [TOKEN_DELAY_S]

Serves on 127.0.0.1:PORT until killed."""

from __future__ import annotations

import sys
from pathlib import Path

import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from standins.vllm_server import VLLMStandIn

if __name__ == "__main__":
    port = int(sys.argv[1])
    standin = VLLMStandIn(token_delay_s=float(sys.argv[2]) if len(sys.argv) > 2 else 0.002)
    standin.base_url = f"http://127.0.0.1:{port}"
    uvicorn.run(standin.app, host="127.0.0.1", port=port, log_level="warning")
