"""The vLLM stand-in as a process of its own, for tests and benches that kill a replica
(SIGKILL):

    python tests/standins/vllm_process.py PORT [TOKEN_DELAY_S]

Serves on 127.0.0.1:PORT until killed. POST /_control {"fail_generation": true} (or
"fail_status", "healthy") sets the stand-in's switches from outside, as a test in the same
process sets the attributes: a bench makes one replica answer 500 for a while. The answer
gives the switches, how many requests the stand-in has received, how many it is generating
for and the tokens each of those has produced; with {"bodies": true}, also every request
body it received (as VLLMStandIn.requests records them) and the request ids it finished, so
a test can see what the gateway sent this replica and a bench which streams it holds."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import uvicorn
from litestar import post

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from standins.vllm_server import VLLMStandIn

SWITCHES = (
    "fail_generation",
    "fail_status",
    "healthy",
    "markov",
    "die_after_tokens",
    "error_after_tokens",
    "stall_after_tokens",
    "signal_at_tokens",
    "signal_number",
)


def with_control(standin: VLLMStandIn) -> None:
    @post("/_control", status_code=200, sync_to_thread=False)
    def control(data: dict[str, Any]) -> dict[str, Any]:
        for name in SWITCHES:
            if name in data:
                setattr(standin, name, data[name])
        answer = {**{name: getattr(standin, name) for name in SWITCHES}, "requests": len(standin.requests)}
        answer["running"] = standin.running
        answer["progress"] = list(standin.progress.values())
        if data.get("bodies"):
            answer["bodies"] = standin.requests
            answer["finished"] = standin.finished
        return answer

    standin.app.register(control)


if __name__ == "__main__":
    port = int(sys.argv[1])
    standin = VLLMStandIn(token_delay_s=float(sys.argv[2]) if len(sys.argv) > 2 else 0.002)
    standin.base_url = f"http://127.0.0.1:{port}"
    with_control(standin)
    uvicorn.run(standin.app, host="127.0.0.1", port=port, log_level="warning")
