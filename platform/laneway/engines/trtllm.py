"""TensorRT-LLM behind Triton, through tritonclient's gRPC aio streaming API.

Speaks the `ensemble` model interface of Triton's TensorRT-LLM backend: inputs text_input,
max_tokens, stream, stop_words, bad_words, temperature, top_p, top_k, end_id, pad_id,
random_seed; output text_output, one response per generated step (decoupled mode), and a
final response flagged `triton_final_response`. Cancelling the gRPC stream cancels the
request on the server. Readiness is ServerReady + ModelReady.

The ensemble takes text, so there is no tokenizer on this side: prompt tokens are
estimated at 4 characters a token (the DESIGN's rule where no tokenizer exists).

Config: url (host:port, required), model (default "ensemble"), max_concurrency, end_id,
pad_id, top_k, bad_words (list), ssl (bool).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any

import numpy as np

from laneway.engines.base import EngineError, run_warmup
from laneway.engines.chat_template import render_chat
from laneway.engines.tool_calls import with_tools
from laneway.types import ChatTurn, Delta, EngineInfo, GenerationRequest, PromptMeasure


class TritonTRTLLMEngine:
    def __init__(
        self,
        alias: str,
        config: dict[str, Any],
        *,
        quantization: str = "unknown",
        gpu_type: str = "unknown",
        max_model_len: int | None = None,
    ) -> None:
        self.alias = alias
        self.url = str(config["url"])
        self.model = str(config.get("model", "ensemble"))
        self.end_id = config.get("end_id")
        self.pad_id = config.get("pad_id")
        self.top_k = int(config.get("top_k", 0))
        self.bad_words = [str(w) for w in config.get("bad_words", [])]
        self.ssl = bool(config.get("ssl", False))
        self.info = EngineInfo(
            engine="trtllm",
            model=alias,
            quantization=quantization,
            gpu_type=gpu_type,
            max_model_len=int(max_model_len or config.get("max_model_len", 4096)),
            max_concurrency=int(config.get("max_concurrency", 64)),
            # The ensemble's optional presence_penalty / frequency_penalty tensors. Not declared:
            # tools and JSON output (no guided decoding in the ensemble), n (beam_width is beam
            # search, not n samples), logprobs (only the chosen tokens', no alternatives), logit_bias.
            capabilities=frozenset({"penalties"}),
        )
        self._client: Any = None
        self._active = 0

    async def start(self) -> None:
        import tritonclient.grpc.aio as triton

        self._client = triton.InferenceServerClient(self.url, ssl=self.ssl)
        if not await self.health():
            await self._client.close()
            raise EngineError(f"Triton at {self.url} is not ready to serve model '{self.model}'")

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    @property
    def active_slots(self) -> int:
        return self._active

    async def health(self) -> bool:
        try:
            return bool(await self._client.is_server_ready()) and bool(await self._client.is_model_ready(self.model))
        except Exception:
            return False

    async def measure(
        self,
        *,
        prompt: str | None = None,
        messages: Sequence[ChatTurn] | None = None,
        tools: Sequence[dict[str, Any]] = (),  # no tools here: the gateway refuses them first
        response_format: dict[str, Any] | None = None,
    ) -> PromptMeasure:
        text = render_chat(with_tools(messages, ())) if messages is not None else (prompt or "")
        return PromptMeasure(text=text, tokens=max(1, (len(text) + 3) // 4))

    async def warmup(self, prompts: Sequence[str]) -> None:
        await run_warmup(self, prompts)

    def _inputs(self, req: GenerationRequest) -> list[Any]:
        import tritonclient.grpc as grpcclient

        def tensor(name: str, value: np.ndarray, dtype: str) -> Any:
            t = grpcclient.InferInput(name, list(value.shape), dtype)
            t.set_data_from_numpy(value)
            return t

        def words(items: Sequence[str]) -> np.ndarray:
            return np.array([[w.encode("utf-8") for w in items]], dtype=object)

        inputs = [
            tensor("text_input", np.array([[req.prompt.encode("utf-8")]], dtype=object), "BYTES"),
            tensor("max_tokens", np.array([[req.max_tokens]], dtype=np.int32), "INT32"),
            tensor("stream", np.array([[True]], dtype=bool), "BOOL"),
            tensor("temperature", np.array([[req.temperature]], dtype=np.float32), "FP32"),
            tensor("top_p", np.array([[req.top_p]], dtype=np.float32), "FP32"),
        ]
        if self.top_k:
            inputs.append(tensor("top_k", np.array([[self.top_k]], dtype=np.int32), "INT32"))
        if req.stop:
            inputs.append(tensor("stop_words", words(req.stop), "BYTES"))
        if self.bad_words:
            inputs.append(tensor("bad_words", words(self.bad_words), "BYTES"))
        if req.seed is not None:
            inputs.append(tensor("random_seed", np.array([[req.seed]], dtype=np.uint64), "UINT64"))
        for name, penalty in (("presence_penalty", req.presence_penalty), ("frequency_penalty", req.frequency_penalty)):
            if penalty:
                inputs.append(tensor(name, np.array([[penalty]], dtype=np.float32), "FP32"))
        for name, value in (("end_id", self.end_id), ("pad_id", self.pad_id)):
            if value is not None:
                inputs.append(tensor(name, np.array([[int(value)]], dtype=np.int32), "INT32"))
        return inputs

    async def generate(self, req: GenerationRequest) -> AsyncGenerator[Delta, None]:
        import tritonclient.grpc as grpcclient

        if self._client is None:
            raise EngineError(f"deployment for {self.alias} is not started")
        request = {
            "model_name": self.model,
            "inputs": self._inputs(req),
            "outputs": [grpcclient.InferRequestedOutput("text_output")],
            "request_id": req.request_id,
        }

        async def requests() -> AsyncIterator[dict[str, Any]]:
            yield request

        self._active += 1
        responses = self._client.stream_infer(requests())
        produced = 0
        try:
            async for result, error in responses:
                if error is not None:
                    raise EngineError(f"Triton error: {error}")
                out = result.as_numpy("text_output")
                text = (
                    b"".join(x if isinstance(x, bytes) else str(x).encode() for x in out.reshape(-1)).decode(
                        "utf-8", "replace"
                    )
                    if out is not None
                    else ""
                )
                params = result.get_response().parameters
                final = "triton_final_response" in params and params["triton_final_response"].bool_param
                if text:
                    produced += 1
                    yield Delta(text=text, tokens=1)
                if final:
                    break
            yield Delta(text="", tokens=0, finish_reason="length" if produced >= req.max_tokens else "stop")
        finally:
            self._active -= 1
            with contextlib.suppress(Exception):
                responses.cancel()  # cancels the gRPC stream: Triton cancels the request
