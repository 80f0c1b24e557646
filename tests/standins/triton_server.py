"""A stand-in for Triton serving TensorRT-LLM's `ensemble`, built from the gRPC protos that
tritonclient ships (GRPCInferenceServiceServicer), on a real loopback port.

ModelStreamInfer reads the ensemble's tensors (text_input, max_tokens, stream, stop_words,
bad_words, temperature, top_p, top_k, end_id, pad_id, random_seed), streams one
text_output response per token, and ends with an empty response flagged
triton_final_response, as the decoupled TensorRT-LLM backend does. It records the inputs of
every request and every stream the client cancelled.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

WORDS = "red orange yellow green blue indigo violet black white grey".split()
DTYPES = {"INT32": np.int32, "FP32": np.float32, "BOOL": np.bool_, "UINT64": np.uint64, "INT64": np.int64}


def decode_inputs(request: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for tensor, raw in zip(request.inputs, request.raw_input_contents, strict=True):
        if tensor.datatype == "BYTES":
            out[tensor.name] = [x.decode() for x in deserialize_bytes_tensor(raw).reshape(-1)]
        else:
            out[tensor.name] = np.frombuffer(raw, dtype=DTYPES[tensor.datatype]).reshape(-1).tolist()
    return out


class TritonStandIn(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    def __init__(self, token_delay_s: float = 0.002, model: str = "ensemble") -> None:
        self.token_delay_s = token_delay_s
        self.model = model
        self.model_ready = True
        self.requests: list[dict[str, Any]] = []
        self.cancelled: list[str] = []
        self.finished: list[str] = []
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: Any = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="triton-standin")
        self._started = threading.Event()

    # ---- the protocol ----
    async def ServerLive(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=True)

    async def ModelReady(self, request: Any, context: Any) -> Any:
        return pb.ModelReadyResponse(ready=self.model_ready and request.name == self.model)

    async def ModelStreamInfer(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        async for request in request_iterator:
            inputs = decode_inputs(request)
            self.requests.append({"id": request.id, "model": request.model_name, **inputs})
            rng = random.Random(int(inputs.get("random_seed", [0])[0]))
            stops = inputs.get("stop_words", [])
            text = ""
            try:
                for _ in range(int(inputs["max_tokens"][0])):
                    await asyncio.sleep(self.token_delay_s)
                    word = " " + rng.choice(WORDS)
                    text += word
                    if any(s in text for s in stops):
                        break
                    yield self._response(request, word, final=False)
                yield self._response(request, "", final=True)
                self.finished.append(request.id)
            except asyncio.CancelledError:
                self.cancelled.append(request.id)  # Triton cancels the TensorRT-LLM request here
                raise

    def _response(self, request: Any, text: str, *, final: bool) -> Any:
        response = pb.ModelInferResponse(model_name=request.model_name, id=request.id)
        response.parameters["triton_final_response"].bool_param = final
        if text:
            tensor = response.outputs.add()
            tensor.name, tensor.datatype = "text_output", "BYTES"
            tensor.shape.extend([1, 1])
            response.raw_output_contents.append(serialize_byte_tensor(np.array([text.encode()], dtype=object)).item())
        return pb.ModelStreamInferResponse(infer_response=response)

    # ---- running it ----
    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()

        async def serve() -> None:
            self._server = grpc.aio.server()
            service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(self, self._server)
            self.port = self._server.add_insecure_port("127.0.0.1:0")
            await self._server.start()
            self._started.set()
            await self._server.wait_for_termination()

        self._loop.run_until_complete(serve())

    def start(self) -> TritonStandIn:
        self._thread.start()
        self._started.wait(10)
        return self

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self._loop is not None and self._server is not None:
            done = asyncio.run_coroutine_threadsafe(self._server.stop(0), self._loop)
            try:
                done.result(3)
            except TimeoutError:  # a stream grpc is still tearing down: the thread is a daemon
                return
        self._thread.join(3)
