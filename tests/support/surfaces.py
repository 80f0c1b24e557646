"""The gateway the API-surface tests (Responses, Messages) run against, and their usage-row wait."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from support.seeding import sim_model
from support.servers import Gateway, start_gateway
from support.waiting import wait_for


def tiny_model(model_path: Path, name: str, **config: Any) -> list[dict[str, Any]]:
    """One deployment of the tiny demo model on llama.cpp (2 slots, 1,024 tokens of context)."""
    return [
        {
            "name": name,
            "engine_kind": "llamacpp",
            "quantization": "f32",
            "gpu_type": "cpu",
            "max_model_len": 1024,
            "config": {"model_path": str(model_path), "parallel": 2, "demo": True, **config},
        }
    ]


def surface_gateway(base: Path, model_path: Path, *, stop: str, sim_decode_ms: float) -> Gateway:
    """tiny, tiny-exact (end of generation banned: always exactly max tokens), sim and
    sim-stop (the sim stopping on `stop`); tenants acme and limited (1 request a minute)."""
    from laneway.engines.demo_model import EOS_TOKEN, IM_END_TOKEN

    return start_gateway(
        base,
        seed_with={
            "models": {
                "tiny": tiny_model(model_path, "tiny-llamacpp"),
                "tiny-exact": tiny_model(model_path, "tiny-exact-llamacpp", ban_tokens=[EOS_TOKEN, IM_END_TOKEN]),
                "sim": sim_model("sim", max_concurrency=4, decode_ms_base=sim_decode_ms, decode_ms_per_seq=0.0),
                "sim-stop": sim_model("sim-stop", max_concurrency=4, decode_ms_base=0.1, stop=[stop]),
            },
            "tenants": {"acme": {"max_concurrency": 1000}, "limited": {"rpm": 1}},
        },
        default_max_tokens=4000,
        usage_flush_interval_s=0.05,
    )


def usage_row(gw: Gateway, request_id: str) -> Any:
    """acme's usage row of `request_id`, once written."""
    found: list[Any] = []

    def written() -> bool:
        found[:] = [r for r in gw.usage_rows("acme") if r.request_id == request_id]
        return bool(found)

    wait_for(written, within=10, step=0.02, what=f"the usage row of {request_id}")
    [row] = found
    return row
