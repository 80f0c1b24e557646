"""The wire types of Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) as
msgspec Structs.

The request is strict at the top level (an unknown parameter is a 400 naming it): a parameter
laneway does not know could change the answer and must not be dropped unseen. Content blocks
and tools are read as plain objects and checked one by one (api/messages/translate.py), so an
unknown or refused block type gets a 400 that says which block and why, and the fields a
block may carry that change nothing here (`cache_control`, `citations`) pass.

The answer's Structs are named Anthropic* so their OpenAPI components never collide with the
OpenAI endpoints' ones.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from laneway.api.protocol import PositiveInt, TopP

# ---- request ---------------------------------------------------------------------------------

Block = dict[str, Any]  # a content block as sent: read by its `type` in translate.py


class MessageParam(Struct, frozen=True):
    role: str  # "user" | "assistant": checked in translate.py, with a 400 that says what to do
    content: str | list[Block]


class Metadata(Struct, frozen=True):
    user_id: Annotated[str, Meta(max_length=256)] | None = None


class ConversationRequest(Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """What count_tokens reads: the conversation and what it offers the model."""

    model: str
    messages: list[MessageParam]
    system: str | list[Block] | None = None
    tools: list[Block] | None = None
    tool_choice: Block | None = None
    thinking: Block | None = None  # extended thinking: refused unless disabled
    output_config: Block | None = None  # `format`: a JSON schema for the answer; `effort`
    cache_control: Block | None = None  # automatic prompt caching: the engine's own business
    mcp_servers: list[Block] | None = None  # run by Anthropic: refused
    context_management: Block | None = None  # server-side context editing: refused


class MessagesRequest(ConversationRequest, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """POST /v1/messages: `max_tokens` is required, as Anthropic requires it."""

    max_tokens: PositiveInt
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None  # Anthropic's range
    top_p: TopP | None = None
    top_k: PositiveInt | None = None
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None  # one tier here: meaningless
    speed: str | None = None  # Anthropic's faster output tier: meaningless here
    container: Any = None  # code execution's container: refused
    inference_geo: str | None = None  # where Anthropic runs it: meaningless here


class CountTokensRequest(ConversationRequest, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """POST /v1/messages/count_tokens."""


# ---- answer ----------------------------------------------------------------------------------

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class AnthropicTextBlock(Struct, tag="text", tag_field="type"):
    text: str


class AnthropicToolUseBlock(Struct, tag="tool_use", tag_field="type"):
    id: str
    name: str
    input: dict[str, Any]


ContentBlock = AnthropicTextBlock | AnthropicToolUseBlock


class AnthropicUsage(Struct, omit_defaults=True):
    input_tokens: int
    output_tokens: int
    # Only where the engine reports tokens read from its prefix cache (none does yet).
    cache_read_input_tokens: int | None = None


class AnthropicMessage(Struct, tag="message", tag_field="type"):
    id: str
    model: str
    content: list[ContentBlock]
    stop_reason: StopReason | None
    stop_sequence: str | None
    usage: AnthropicUsage
    role: Literal["assistant"] = "assistant"


class TokenCount(Struct):
    input_tokens: int


# ---- stream events ---------------------------------------------------------------------------


class TextDelta(Struct, tag="text_delta", tag_field="type"):
    text: str


class InputJsonDelta(Struct, tag="input_json_delta", tag_field="type"):
    partial_json: str


class MessageStart(Struct, tag="message_start", tag_field="type"):
    message: AnthropicMessage


class ContentBlockStart(Struct, tag="content_block_start", tag_field="type"):
    index: int
    content_block: ContentBlock


class ContentBlockDelta(Struct, tag="content_block_delta", tag_field="type"):
    index: int
    delta: TextDelta | InputJsonDelta


class ContentBlockStop(Struct, tag="content_block_stop", tag_field="type"):
    index: int


class MessageDeltaBody(Struct):
    stop_reason: StopReason | None
    stop_sequence: str | None


class DeltaUsage(Struct):
    output_tokens: int
    input_tokens: int


class MessageDelta(Struct, tag="message_delta", tag_field="type"):
    delta: MessageDeltaBody
    usage: DeltaUsage


class MessageStop(Struct, tag="message_stop", tag_field="type"):
    pass


class Ping(Struct, tag="ping", tag_field="type"):
    pass


# ---- errors ----------------------------------------------------------------------------------


class AnthropicErrorBody(Struct):
    type: str
    message: str


class AnthropicError(Struct, tag="error", tag_field="type"):
    error: AnthropicErrorBody


StreamEvent = (
    MessageStart
    | ContentBlockStart
    | ContentBlockDelta
    | ContentBlockStop
    | MessageDelta
    | MessageStop
    | Ping
    | AnthropicError
)
