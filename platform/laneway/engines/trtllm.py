"""TensorRT-LLM behind Triton, through tritonclient's gRPC aio streaming API.

Speaks the `ensemble` model interface of Triton's TensorRT-LLM backend: inputs text_input,
max_tokens, stream, stop_words, bad_words, temperature, top_p, top_k, end_id, pad_id,
random_seed, presence_penalty, frequency_penalty; output text_output, one response per
generated step (decoupled mode). Cancelling the gRPC stream cancels the request on the server.
Readiness is ServerReady + ModelReady.

How a stream ends: real Triton flags the last token's response COMPLETE_FINAL and, unless the
client asked for `triton_enable_empty_final_response` (which tritonclient's aio client refuses
to send: it rejects every `triton_`-prefixed parameter), puts no marker on the wire; the server
closes the gRPC stream once every request on it is final (the client half-closes after its one
request). So a cleanly closed stream is the end; an empty response flagged
`triton_final_response` (what some servers send) ends it too. A stream broken by the server
(killed, restarted, network gone) is an EngineError, never a raw gRPC error.

The ensemble takes text, so there is no tokenizer on this side: prompt tokens are
estimated at 4 characters a token (the DESIGN's rule where no tokenizer exists).

Config: TritonConfig (engines/config.py): url (host:port, required), model (default
"ensemble"), max_concurrency, end_id, pad_id, top_k, bad_words (list), ssl (bool),
probe_timeout_s (each readiness call at start() and in health checks; default 2).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from typing import Any, Unpack

import numpy as np

from laneway.engines.adapter import DeploymentFacts, EngineAdapter
from laneway.engines.base import EngineError, run_warmup
from laneway.engines.config import TritonConfig
from laneway.types import Delta, GenerationRequest


class TritonTRTLLMEngine(EngineAdapter[TritonConfig]):
    engine = "trtllm"
    config_type = TritonConfig

    def __init__(self, alias: str, config: Mapping[str, Any] | TritonConfig, **row: Unpack[DeploymentFacts]) -> None:
        super().__init__(alias, config, **row)
        c = self.config
        self.url = c.url
        self.model = c.model
        self.end_id = c.end_id
        self.pad_id = c.pad_id
        self.top_k = c.top_k
        self.bad_words = list(c.bad_words)
        self.ssl = c.ssl
        # The ensemble's optional presence_penalty / frequency_penalty tensors. Not declared:
        # tools and JSON output (no guided decoding in the ensemble), n (beam_width is beam
        # search, not n samples), logprobs (only the chosen tokens', no alternatives), logit_bias.
        # Of the sampling extensions, the ensemble's top_k tensor (the config's top_k is the default).
        self.info = self.describe(
            context=self.max_model_len or c.max_model_len,
            slots=c.max_concurrency,
            capabilities={"penalties", "top_k"},
        )
        self.probe_timeout_s = c.probe_timeout_s
        self._client: Any = None
        self._active = 0

    async def start(self) -> None:
        import tritonclient.grpc.aio as triton  # the kind's extra: checked before it is built (kinds.py)

        client = triton.InferenceServerClient(self.url, ssl=self.ssl)
        try:
            reason = await self._unready_reason(client)
        except BaseException:
            await client.close()
            raise
        if reason is not None:
            await client.close()
            raise EngineError(reason)
        self._client = client

    async def _unready_reason(self, client: Any) -> str | None:
        """Why Triton cannot serve the model now, in one line; None when it can."""
        timeout = self.probe_timeout_s
        try:
            server_ready = await asyncio.wait_for(client.is_server_ready(client_timeout=timeout), timeout + 1)
            if not server_ready:
                return f"Triton at {self.url} is up but not ready"
            if not await asyncio.wait_for(client.is_model_ready(self.model, client_timeout=timeout), timeout + 1):
                return f"model '{self.model}' is not ready on Triton at {self.url} (not loaded, or failed to load)"
        except TimeoutError:
            return f"Triton at {self.url} did not answer within {timeout:g} s"
        except Exception as exc:  # InferenceServerException: the gRPC status, e.g. UNAVAILABLE
            return f"Triton at {self.url} is unreachable: {_one_line(exc)}"
        return None

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    @property
    def active_slots(self) -> int:
        return self._active

    async def health(self) -> bool:
        if self._client is None:
            return False
        return await self._unready_reason(self._client) is None

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
        asked_k = req.extensions.top_k if req.extensions is not None else None
        top_k = asked_k if asked_k is not None and asked_k > 0 else self.top_k
        if top_k:
            inputs.append(tensor("top_k", np.array([[top_k]], dtype=np.int32), "INT32"))
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

    def request(self, req: GenerationRequest) -> dict[str, Any]:
        """What stream_infer sends for `req`. No request parameters: Triton reserves the
        `triton_` prefix and the aio client refuses it; the ensemble reads everything from tensors."""
        import tritonclient.grpc as grpcclient

        return {
            "model_name": self.model,
            "inputs": self._inputs(req),
            "outputs": [grpcclient.InferRequestedOutput("text_output")],
            "request_id": req.request_id,
        }

    async def generate(self, req: GenerationRequest) -> AsyncGenerator[Delta, None]:
        import grpc
        from tritonclient.utils import InferenceServerException

        if self._client is None:
            raise EngineError(f"deployment for {self.alias} is not started")
        request = self.request(req)

        async def requests() -> AsyncIterator[dict[str, Any]]:
            yield request

        self._active += 1
        responses: Any = None
        produced = 0
        try:
            try:
                responses = self._client.stream_infer(requests())
                async for result, error in responses:
                    if error is not None:
                        raise EngineError(f"Triton error: {_one_line(error)}")
                    text = _text(result.as_numpy("text_output"))
                    params = result.get_response().parameters
                    final = "triton_final_response" in params and params["triton_final_response"].bool_param
                    if text:
                        produced += 1
                        yield Delta(text=text, tokens=1)
                    if final:
                        break
            except grpc.aio.AioRpcError as exc:  # the stream broke: server killed, restarted, unreachable
                raise EngineError(
                    f"Triton at {self.url} broke the stream after {produced} tokens: "
                    f"{exc.code().name}: {_one_line(exc.details() or '')}"
                ) from None
            except InferenceServerException as exc:  # the client refused the request before sending it
                raise EngineError(f"Triton client error: {_one_line(exc)}") from None
            # The stream closed cleanly: every request on it reached its final response.
            yield Delta(text="", tokens=0, finish_reason="length" if produced >= req.max_tokens else "stop")
        finally:
            self._active -= 1
            if responses is not None:
                with contextlib.suppress(Exception):
                    responses.cancel()  # cancels the gRPC stream: Triton cancels the request


def _text(out: Any) -> str:
    """text_output (a BYTES tensor of any shape; None when the response carries none) as text."""
    if out is None:
        return ""
    return b"".join(x if isinstance(x, bytes) else str(x).encode() for x in out.reshape(-1)).decode("utf-8", "replace")


def _one_line(exc: object) -> str:
    text = " ".join(str(exc).split())
    return text[:300] + ("..." if len(text) > 300 else "")
