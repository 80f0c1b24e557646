"""What every engine adapter's constructor does alike, said once: keep the alias, decode the
deployment's config into the kind's struct (engines/config.py: a refusal names the key), keep
what the deployment row says of the engine (quantization, GPU, context), and describe the
engine for routing, limits and /v1/models (EngineInfo). An adapter subclasses EngineAdapter,
names its config struct and its defaults, and adds only its own state (and its own
count_prompt() where it has a tokenizer: the default estimates):

    class MyEngine(EngineAdapter[MyConfig]):
        engine = "mine"
        config_type = MyConfig

        def __init__(self, alias: str, config: Mapping[str, Any] | MyConfig, **row: Unpack[DeploymentFacts]) -> None:
            super().__init__(alias, config, **row)
            self.info = self.describe(context=self.max_model_len or 4096, slots=self.config.slots)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypedDict

from laneway.engines.chat_template import render_chat
from laneway.engines.config import ConfigT, parse_config
from laneway.engines.tool_calls import with_tools
from laneway.types import ChatTurn, EngineInfo, PromptMeasure


class DeploymentFacts(TypedDict, total=False):
    """What a deployment row says of its engine beside the config (the registry passes all three)."""

    quantization: str
    gpu_type: str
    max_model_len: int | None


@dataclass(frozen=True, slots=True)
class PromptParts:
    """What a request's prompt is made of, as measure() is given it: a completion's text, or a
    chat's messages with the tools offered and the JSON form asked for."""

    prompt: str | None = None
    messages: Sequence[ChatTurn] | None = None
    tools: Sequence[dict[str, Any]] = ()
    response_format: dict[str, Any] | None = None


class EngineAdapter(Generic[ConfigT]):
    engine: ClassVar[str]  # EngineInfo.engine: the kind's name, as metrics and /v1/models show it
    config_type: type[ConfigT]  # the struct the deployment's config is decoded into
    # What an engine built without a deployment row (a test, a bench) reports.
    default_quantization: ClassVar[str] = "unknown"
    default_gpu_type: ClassVar[str] = "unknown"
    info: EngineInfo

    def __init__(
        self,
        alias: str,
        config: Mapping[str, Any] | ConfigT,
        *,
        quantization: str | None = None,
        gpu_type: str | None = None,
        max_model_len: int | None = None,
    ) -> None:
        self.alias = alias
        self.config = parse_config(self.config_type, config)
        self.quantization = self.default_quantization if quantization is None else quantization
        self.gpu_type = self.default_gpu_type if gpu_type is None else gpu_type
        self.max_model_len = max_model_len  # the deployment's context; None: the engine's own

    def describe(
        self, *, context: int, slots: int, capabilities: Iterable[str] = (), embeddings_only: bool = False
    ) -> EngineInfo:
        """The engine's static info. An embeddings-only engine (a pooling model) declares
        "embeddings" and nothing else, and generates nothing: chat is refused for it by name."""
        return EngineInfo(
            engine=self.engine,
            model=self.alias,
            quantization=self.quantization,
            gpu_type=self.gpu_type,
            max_model_len=context,
            max_concurrency=slots,
            capabilities=frozenset({"embeddings"}) if embeddings_only else frozenset(capabilities),
            generates=not embeddings_only,
        )

    async def measure(
        self,
        *,
        prompt: str | None = None,
        messages: Sequence[ChatTurn] | None = None,
        tools: Sequence[dict[str, Any]] = (),
        response_format: dict[str, Any] | None = None,
    ) -> PromptMeasure:
        """The Engine protocol's measure(): the adapter counts the parts in count_prompt()."""
        return await self.count_prompt(PromptParts(prompt, messages, tools, response_format))

    async def count_prompt(self, parts: PromptParts) -> PromptMeasure:
        """An engine without a tokenizer on this side (sim, Triton's ensemble takes text) counts
        4 characters a token, the chat rendered with ChatML as a template would lay it out (no
        tools: the gateway refuses them first, as no engine keeping this declares them)."""
        text = render_chat(with_tools(parts.messages, ())) if parts.messages is not None else (parts.prompt or "")
        return PromptMeasure(text=text, tokens=max(1, (len(text) + 3) // 4))
