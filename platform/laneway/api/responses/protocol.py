"""The wire types of OpenAI's Responses API (POST /v1/responses) as msgspec Structs.

The request is strict at the top level (an unknown parameter is a 400, as OpenAI answers it):
a parameter laneway does not know could change the output, and must not be dropped unseen.
Input items are lenient: clients send a previous response's output items back as input, with
fields (ids, statuses, annotations) that do not matter here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct, field

from laneway.api.protocol import PositiveInt, Temperature, TopP

ResponseStatus = Literal["in_progress", "completed", "incomplete", "failed"]
ItemStatus = Literal["in_progress", "completed", "incomplete"]

# ---- request ---------------------------------------------------------------------------------


class InputPart(Struct, frozen=True):
    """A content part of an input message: input_text / output_text / refusal are read; the
    others (input_image, input_file, input_audio) are refused by name."""

    type: str
    text: str | None = None
    refusal: str | None = None


class InputMessage(Struct, frozen=True):
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputPart]
    type: Literal["message"] = "message"


class FunctionCallInput(Struct, frozen=True):
    """A call the model made earlier, sent back as history."""

    call_id: str
    name: str
    arguments: str
    type: Literal["function_call"] = "function_call"


class FunctionCallOutputInput(Struct, frozen=True):
    """The caller's result of a function call."""

    call_id: str
    output: str | list[InputPart]
    type: Literal["function_call_output"] = "function_call_output"


class FunctionToolIn(Struct, frozen=True):
    name: Annotated[str, Meta(min_length=1)]
    type: Literal["function"] = "function"
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class JsonSchemaFormat(Struct, frozen=True):
    """`text.format` asking for JSON that matches `schema`."""

    name: Annotated[str, Meta(min_length=1, max_length=64)]
    schema: dict[str, Any]
    type: Literal["json_schema"] = "json_schema"
    description: str | None = None
    strict: bool | None = None


class ResponsesRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    model: Annotated[str, Meta(min_length=1)]
    # A string, or a list of items; items are dispatched on `type` (a message may omit it) by
    # api/responses/request.py, which names the offending item in its 400.
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    metadata: Annotated[dict[str, str], Meta(max_length=16)] | None = None
    user: str | None = None
    stream: bool = False
    # laneway keeps no state: a response is never stored (the answer says `store: false`).
    store: bool | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    # Read only to refuse them by name (they change the output, or need stored state).
    previous_response_id: str | None = None
    conversation: Any = None
    prompt: Any = None
    background: bool | None = None
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    moderation: Any = None
    context_management: list[Any] | None = None
    # OpenAI's cache-affinity key (checked as chat's is): the conversation goes back to the
    # replica that served it while load allows.
    prompt_cache_key: str | None = None
    # vLLM's prefix-cache salt: the gateway sets the tenant's own, so a client's is dropped unread.
    cache_salt: Any = None
    # Accepted, with no effect on the output here: caching, routing and accounting hints of
    # OpenAI's own service, and a cap on built-in tools (laneway has none).
    stream_options: dict[str, Any] | None = None
    max_tool_calls: int | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    background_options: dict[str, Any] | None = None
    access_programs: dict[str, Any] | None = None
    image: dict[str, Any] | None = None


# ---- response --------------------------------------------------------------------------------


class OutputText(Struct, tag="output_text", tag_field="type"):
    text: str
    annotations: list[Any] = []
    logprobs: list[Any] = []


class OutputMessage(Struct, tag="message", tag_field="type"):
    id: str
    status: ItemStatus
    content: list[OutputText]
    role: str = "assistant"


class FunctionCallItem(Struct, tag="function_call", tag_field="type"):
    id: str
    call_id: str
    name: str
    arguments: str
    status: ItemStatus


OutputItem = OutputMessage | FunctionCallItem


class InputTokensDetails(Struct):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(Struct):
    reasoning_tokens: int = 0


class ResponseUsage(Struct):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: InputTokensDetails = field(default_factory=InputTokensDetails)
    output_tokens_details: OutputTokensDetails = field(default_factory=OutputTokensDetails)


class IncompleteDetails(Struct):
    reason: str


class ResponseError(Struct):
    code: str
    message: str


class ReasoningConfig(Struct):
    effort: str | None = None
    summary: str | None = None


class ResponseObject(Struct, kw_only=True):
    id: str
    object: str = "response"
    created_at: int
    status: ResponseStatus
    model: str
    output: list[OutputItem]
    usage: ResponseUsage | None = None
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    completed_at: int | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    metadata: dict[str, str] = {}
    parallel_tool_calls: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = []
    text: dict[str, Any] = field(default_factory=lambda: {"format": {"type": "text"}})
    reasoning: ReasoningConfig = field(default_factory=ReasoningConfig)
    truncation: str = "disabled"
    previous_response_id: None = None
    background: bool = False
    store: bool = False  # nothing is kept: GET /v1/responses/{id} has nothing to find
    user: str | None = None


# ---- stream events: each has `type` (its SSE event name) and `sequence_number` ---------------


class _Event(Struct, kw_only=True, tag_field="type"):
    sequence_number: int = 0  # set as the event is sent (ResponseAssembler)


class ResponseCreated(_Event, tag="response.created"):
    response: ResponseObject


class ResponseInProgress(_Event, tag="response.in_progress"):
    response: ResponseObject


class ResponseCompleted(_Event, tag="response.completed"):
    response: ResponseObject


class ResponseIncomplete(_Event, tag="response.incomplete"):
    response: ResponseObject


class ResponseFailed(_Event, tag="response.failed"):
    response: ResponseObject


class OutputItemAdded(_Event, tag="response.output_item.added"):
    output_index: int
    item: OutputItem


class OutputItemDone(_Event, tag="response.output_item.done"):
    output_index: int
    item: OutputItem


class ContentPartAdded(_Event, tag="response.content_part.added"):
    item_id: str
    output_index: int
    content_index: int
    part: OutputText


class ContentPartDone(_Event, tag="response.content_part.done"):
    item_id: str
    output_index: int
    content_index: int
    part: OutputText


class OutputTextDelta(_Event, tag="response.output_text.delta"):
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[Any] = []


class OutputTextDone(_Event, tag="response.output_text.done"):
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[Any] = []


class FunctionCallArgumentsDelta(_Event, tag="response.function_call_arguments.delta"):
    item_id: str
    output_index: int
    delta: str


class FunctionCallArgumentsDone(_Event, tag="response.function_call_arguments.done"):
    item_id: str
    output_index: int
    arguments: str


class ErrorEvent(_Event, tag="error"):
    code: str | None
    message: str
    param: str | None = None


StreamEvent = (
    ResponseCreated
    | ResponseInProgress
    | ResponseCompleted
    | ResponseIncomplete
    | ResponseFailed
    | OutputItemAdded
    | OutputItemDone
    | ContentPartAdded
    | ContentPartDone
    | OutputTextDelta
    | OutputTextDone
    | FunctionCallArgumentsDelta
    | FunctionCallArgumentsDone
    | ErrorEvent
)
