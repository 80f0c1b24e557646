"""What a request asks of its engine beyond plain text, checked against what the chosen
deployment's adapter declares (EngineInfo.capabilities): a 400 naming the parameter, never a
200 that quietly ignored it (an agent would get prose, a JSON-mode client unparseable text)."""

from __future__ import annotations

from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import invalid_request
from laneway.types import EngineInfo, GenerationRequest

WHAT = {
    "tools": "tool calls",
    "json_object": "JSON output",
    "json_schema": "output constrained by a JSON schema",
    "logprobs": "token log probabilities",
    "n": "several choices per request",
    "penalties": "presence and frequency penalties",
    "logit_bias": "token biases",
    "top_k": "top-k sampling",
    "min_p": "min-p sampling",
    "repetition_penalty": "a repetition penalty",
    "ignore_eos": "generating past the end-of-sequence token",
    "min_tokens": "a minimum number of generated tokens",
    "stop_token_ids": "stopping on token ids",
    "include_stop_str_in_output": "keeping the stop string in the output",
    "skip_special_tokens": "special tokens in the output",
    "spaces_between_special_tokens": "special tokens joined without spaces",
    "truncate_prompt_tokens": "prompt truncation",
    "structured_outputs": "vLLM's structured outputs",
}


def asked(g: GenerationRequest) -> list[tuple[str, str]]:
    """(capability, the parameter that asks for it) for each feature the request uses; the
    values that ask for nothing (n=1, penalties of 0, tool_choice none) ask for nothing."""
    out: list[tuple[str, str]] = []
    if g.tools and g.tool_choice != "none":
        out.append(("tools", "tools"))
    kind = (g.response_format or {}).get("type")
    if kind in ("json_object", "json_schema"):
        out.append((str(kind), "response_format"))
    if g.logprobs is not None:
        out.append(("logprobs", "logprobs"))
    if g.n > 1:
        out.append(("n", "n"))
    if g.presence_penalty:
        out.append(("penalties", "presence_penalty"))
    if g.frequency_penalty:
        out.append(("penalties", "frequency_penalty"))
    if g.logit_bias:
        out.append(("logit_bias", "logit_bias"))
    if g.extensions is not None:
        out.extend((name, name) for name in g.extensions.asked())
    return out


def check(info: EngineInfo, alias: str, g: GenerationRequest) -> None:
    for capability, param in asked(g):
        if capability not in info.capabilities:
            raise invalid_request(
                f"`{param}` ({WHAT[capability]}) is not supported by the engine serving '{alias}' "
                f"({info.engine}); the request was not run.",
                param=param,
                code=ErrorCode.UNSUPPORTED_PARAMETER,
            )
