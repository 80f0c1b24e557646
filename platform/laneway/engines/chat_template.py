"""Render chat messages with a model's Jinja chat template (sandboxed, as HF does)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from jinja2.sandbox import ImmutableSandboxedEnvironment

from laneway.types import ChatTurn

CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@lru_cache(maxsize=32)
def _compile(template: str):  # type: ignore[no-untyped-def]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template)


def render_chat(messages: Sequence[ChatTurn], template: str = CHATML, **extra: str) -> str:
    turns = [{"role": m.role, "content": m.content} for m in messages]
    return str(_compile(template).render(messages=turns, add_generation_prompt=True, **extra))
