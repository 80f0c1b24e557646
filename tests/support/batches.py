"""Batch jobs through the official SDK: write a JSONL input, upload it, wait for the batch to
end, read its output and error files as {custom_id: line}."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterable
from typing import Any

import openai

ENDED = ("completed", "failed", "expired", "cancelled")


def jsonl(lines: Iterable[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(x).encode() + b"\n" for x in lines)


def line(custom_id: str, url: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def chat_line(custom_id: str, model: str, text: str, **extra: Any) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 8, **extra}
    return line(custom_id, "/v1/chat/completions", body)


def upload(client: openai.OpenAI, content: bytes, name: str = "input.jsonl") -> str:
    return client.files.create(file=(name, io.BytesIO(content)), purpose="batch").id


def run_batch(client: openai.OpenAI, content: bytes, endpoint: str = "/v1/chat/completions", **extra: Any) -> Any:
    file_id = upload(client, content)
    return client.batches.create(
        input_file_id=file_id,
        endpoint=endpoint,
        completion_window="24h",  # type: ignore[arg-type]
        **extra,
    )


def wait_ended(client: openai.OpenAI, batch_id: str, within: float = 60.0) -> Any:
    deadline = time.monotonic() + within
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ENDED:
            return batch
        assert time.monotonic() < deadline, f"batch {batch_id} still {batch.status} after {within} s"
        time.sleep(0.1)


def file_lines(client: openai.OpenAI, file_id: str | None) -> dict[str, dict[str, Any]]:
    """{custom_id: line} of an output or error file; asserts no custom_id appears twice."""
    if file_id is None:
        return {}
    out: dict[str, dict[str, Any]] = {}
    for raw in client.files.content(file_id).text.splitlines():
        if raw.strip():
            parsed = json.loads(raw)
            assert parsed["custom_id"] not in out, f"custom_id {parsed['custom_id']} answered twice"
            out[parsed["custom_id"]] = parsed
    return out
