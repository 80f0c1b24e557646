"""A Python-backend model for a real tritonserver that speaks TensorRT-LLM's `ensemble`
interface (the tensors of tensorrtllm_backend's all_models/inflight_batcher_llm/ensemble), so
the TensorRT-LLM adapter can be tested against real Triton without a GPU.

Decoupled: one text_output response per generated "token" (one word), the last one flagged
TRITONSERVER_RESPONSE_COMPLETE_FINAL as TensorRT-LLM does; no extra empty response (Triton
adds one only where the client asked for it). Honours max_tokens and stop_words (the word that
completes a stop word is sent, then the stream ends: the gateway cuts it); presence_penalty > 0
never repeats a word, so a test can see the penalty reach the model. Checks
sender.is_cancelled() before each token.

Every request is recorded, as JSON lines in the file named by the config parameter
`record_path`: {"event": "received", "id", "inputs"} on arrival, then {"event": "completed" |
"cancelled", "id", "tokens"} when it ends. Written and closed per line, so a test reads it
while the server runs, and what was written survives the server being killed.
"""

from __future__ import annotations

import json
import random
import threading
import time
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils  # provided by the Python backend's stub

WORDS = "red orange yellow green blue indigo violet black white grey".split()
OPTIONAL = (
    "bad_words",
    "stop_words",
    "end_id",
    "pad_id",
    "top_k",
    "top_p",
    "temperature",
    "random_seed",
    "stream",
    "presence_penalty",
    "frequency_penalty",
)


def _value(tensor: Any) -> Any:
    """A tensor as plain JSON values: strings for BYTES, numbers or booleans otherwise."""
    array = tensor.as_numpy().reshape(-1)
    if array.dtype == np.object_:
        return [x.decode("utf-8") if isinstance(x, bytes) else str(x) for x in array]
    return array.tolist()


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.token_delay_s = float(params.get("token_delay_s", "0.01"))
        self.record_path = params.get("record_path", "")
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def _record(self, **event: Any) -> None:
        if not self.record_path:
            return
        with self._lock, open(self.record_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(event) + "\n")

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            # Read every tensor here: their buffers are released when execute() returns.
            inputs = {
                "text_input": _value(pb_utils.get_input_tensor_by_name(request, "text_input")),
                "max_tokens": _value(pb_utils.get_input_tensor_by_name(request, "max_tokens")),
            }
            for name in OPTIONAL:
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is not None:
                    inputs[name] = _value(tensor)
            request_id = request.request_id()
            self._record(event="received", id=request_id, inputs=inputs)
            thread = threading.Thread(
                target=self._stream, args=(request.get_response_sender(), request_id, inputs), daemon=True
            )
            thread.start()
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        return None  # decoupled: the responses go through each request's sender

    def _stream(self, sender: Any, request_id: str, inputs: dict[str, Any]) -> None:
        rng = random.Random(int(inputs.get("random_seed", [0])[0]))
        max_tokens = int(inputs["max_tokens"][0])
        stops = [s for s in inputs.get("stop_words", []) if s]
        no_repeat = float(inputs.get("presence_penalty", [0.0])[0]) > 0
        text, sent, used = "", 0, set[str]()
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        while sent < max_tokens:
            time.sleep(self.token_delay_s)
            if sender.is_cancelled():
                self._record(event="cancelled", id=request_id, tokens=sent)
                sender.send(flags=final)  # a cancelled request still ends its response stream
                return
            choices = [w for w in WORDS if w not in used] if no_repeat else WORDS
            word = rng.choice(choices or WORDS)
            used.add(word)
            text += " " + word
            sent += 1
            last = sent >= max_tokens or any(s in text for s in stops)
            output = pb_utils.Tensor("text_output", np.array([[(" " + word).encode("utf-8")]], dtype=np.object_))
            sender.send(pb_utils.InferenceResponse(output_tensors=[output]), flags=final if last else 0)
            if last:
                break
        if sent == 0:
            sender.send(flags=final)  # max_tokens 0: nothing to say, but the stream must end
        self._record(event="completed", id=request_id, tokens=sent)

    def finalize(self) -> None:
        for thread in self._threads:
            thread.join(5)
