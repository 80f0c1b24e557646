"""What the adapter sends vLLM: request bodies and headers."""

from __future__ import annotations

from typing import Any

import msgspec

from laneway.types import ChatTurn, GenerationRequest

encode = msgspec.json.Encoder().encode

JSON_HEADERS = (("Content-Type", "application/json"),)


def request_headers(request_id: str, trace_headers: tuple[tuple[str, str], ...]) -> list[tuple[str, str]]:
    """A generation's headers: its id (vLLM's request id, in its logs) and, with tracing on,
    the span's W3C headers (vLLM started with --otlp-traces-endpoint joins the trace)."""
    return [("X-Request-Id", request_id), *JSON_HEADERS, *trace_headers]


def chat_message(m: ChatTurn) -> dict[str, Any]:
    """A chat turn as vLLM takes it: with its tool calls, or the call a tool result answers."""
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in m.tool_calls
        ]
        out["content"] = m.content or None
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out


def streams_from_vllm(req: GenerationRequest) -> bool:
    """Whether to ask vLLM for a stream: for a streaming client, and whenever tools are offered.
    vLLM's tool parser answers a call cut at max_tokens as its raw call text in `content` when
    not streaming, but as the call itself (name, arguments so far) when streaming: the shape
    OpenAI and laneway's other engines give, whatever the client asked for."""
    return req.stream or (bool(req.tools) and req.tool_choice != "none")


def generation_body(req: GenerationRequest, model: str, extra_body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The path and body of a generation: chat to /v1/chat/completions (vLLM applies the
    model's own template), a prompt to /v1/completions. The request's cache_salt goes as vLLM's
    `cache_salt`, so vLLM reuses cached prompt blocks only between requests of one tenant.

    A continuation (an answer another replica began) goes as text: on chat, the answer so far
    as the last assistant message, continued (`continue_final_message`, no generation prompt:
    the template renders the turn open, as the first replica's prompt ended); on completions,
    the prompt followed by it."""
    stream = streams_from_vllm(req)
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": req.max_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "stream": stream,
        **extra_body,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    if req.seed is not None:
        body["seed"] = req.seed
    if req.stop:
        body["stop"] = list(req.stop)
    if req.priority:
        body["priority"] = req.priority
    if req.n > 1:
        body["n"] = req.n
    if req.presence_penalty:
        body["presence_penalty"] = req.presence_penalty
    if req.frequency_penalty:
        body["frequency_penalty"] = req.frequency_penalty
    if req.logit_bias:
        body["logit_bias"] = {str(k): v for k, v in req.logit_bias.items()}
    if req.extensions is not None:
        body.update(req.extensions.body())
    if req.cache_salt is not None:  # the tenant's prefix-cache partition: after extra_body, so it wins
        body["cache_salt"] = req.cache_salt
    so_far = req.continuation.text if req.continuation is not None else None
    if req.messages is not None:
        body["messages"] = [chat_message(m) for m in req.messages]
        if so_far is not None:
            body["messages"].append({"role": "assistant", "content": so_far})
            body.update(continue_final_message=True, add_generation_prompt=False)
        if req.tools:
            body.update(tools=list(req.tools), parallel_tool_calls=req.parallel_tool_calls)
            if req.tool_choice is not None:
                body["tool_choice"] = req.tool_choice
        if req.response_format is not None:
            body["response_format"] = req.response_format
        if req.logprobs is not None:
            body.update(logprobs=True, top_logprobs=req.logprobs)
        return "/v1/chat/completions", body
    if req.logprobs is not None:
        body["logprobs"] = req.logprobs
    body["prompt"] = req.prompt if so_far is None else req.prompt + so_far
    return "/v1/completions", body
