"""bench/replica_server.py, the llama.cpp replica behind bench/routing.py: one process on the
tiny demo model, driven over real HTTP with the official openai SDK. What the routing bench
relies on: health and the model card, a streamed chat with its usage chunk, a repeated prompt
served from the prefix cache (and only under its own cache_salt), /reset emptying the cache,
and the vLLM metrics that count it all."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI
from support import free_port, wait_for

SERVER = Path(__file__).resolve().parents[2] / "bench" / "replica_server.py"
MESSAGES = [
    {"role": "system", "content": "the of and to in is that it for was on are with as be this have"},
    {"role": "user", "content": "hello world"},
]


@pytest.fixture(scope="module")
def replica(demo_model_path: Path) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            str(SERVER),
            "--model",
            str(demo_model_path),
            "--port",
            str(port),
            "--served-name",
            "tiny",
            "--n-ctx",
            "512",
            "--cache-bytes",
            str(64 << 20),
        ]
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, f"replica_server exited with {proc.returncode}"
        try:
            return httpx.get(url + "/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, within=60, what="replica_server")
        yield url
    finally:
        proc.terminate()
        proc.wait(20)


def client(url: str) -> OpenAI:
    return OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)


def chat(url: str, salt: str, **extra: Any) -> Any:
    return client(url).chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=3, temperature=0, extra_body={"cache_salt": salt, **extra}
    )  # type: ignore[call-overload]


def metrics(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{", 1)[0]
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def test_health_and_the_model_card(replica: str) -> None:
    assert httpx.get(replica + "/health").status_code == 200
    [card] = httpx.get(replica + "/v1/models").json()["data"]
    assert (card["id"], card["max_model_len"]) == ("tiny", 512)
    assert [m.id for m in client(replica).models.list()] == ["tiny"]


def test_a_streamed_chat_ends_with_its_usage(replica: str) -> None:
    stream = client(replica).chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=4,
        temperature=0,
        stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
        extra_body={"cache_salt": "stream", "some_router_field": 1},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] in (
        ["length"],
        ["stop"],
    )
    usage = chunks[-1].usage
    assert usage is not None and not chunks[-1].choices
    assert usage.prompt_tokens > 10 and 0 < usage.completion_tokens <= 4
    assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens == 0


def test_a_repeated_prompt_is_served_from_the_cache_of_its_own_salt_only(replica: str) -> None:
    first = chat(replica, "tenant-a")
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    again = chat(replica, "tenant-a")
    # All but the last prompt token, which is always computed again.
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    assert again.choices[0].message.content == first.choices[0].message.content
    assert chat(replica, "tenant-b").usage.prompt_tokens_details.cached_tokens == 0
    back = chat(replica, "tenant-a")  # tenant-b's request took the live context: a saved state
    assert back.usage.prompt_tokens_details.cached_tokens == back.usage.prompt_tokens - 1


def test_reset_empties_the_cache(replica: str) -> None:
    chat(replica, "reset")
    assert chat(replica, "reset").usage.prompt_tokens_details.cached_tokens > 0
    assert httpx.post(replica + "/reset", json={}).status_code == 200
    assert chat(replica, "reset").usage.prompt_tokens_details.cached_tokens == 0


def test_metrics_count_prompt_tokens_and_cache_hits(replica: str) -> None:
    before = metrics(replica)
    answers = [chat(replica, "metrics") for _ in range(2)]
    after = metrics(replica)
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"):
        assert after[name] == 0, name  # nothing running or queued now
    prompt = sum(a.usage.prompt_tokens for a in answers)
    cached = sum(a.usage.prompt_tokens_details.cached_tokens for a in answers)
    assert cached > 0
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == prompt
    assert after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"] == prompt
    assert after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"] == cached
    assert after["vllm:request_success_total"] - before["vllm:request_success_total"] == 2
