"""OpenAI's Files and Batches objects, as the official SDKs read them (timestamps in Unix
seconds), and the request body of POST /v1/batches."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from msgspec import Struct


def unix(ts: datetime | None) -> int | None:
    return None if ts is None else int(ts.timestamp())


class FileObject(Struct, kw_only=True):
    id: str
    object: str = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: str = "processed"
    status_details: str | None = None
    expires_at: int | None = None


class FileList(Struct, kw_only=True):
    object: str = "list"
    data: list[FileObject]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class FileDeleted(Struct, kw_only=True):
    id: str
    object: str = "file"
    deleted: bool = True


class CreateBatchRequest(Struct, kw_only=True, frozen=True):
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None
    output_expires_after: dict[str, Any] | None = None  # accepted; output files are kept until deleted


class RequestCounts(Struct, kw_only=True):
    total: int
    completed: int
    failed: int


class BatchErrorData(Struct, kw_only=True):
    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(Struct, kw_only=True):
    object: str = "list"
    data: list[BatchErrorData]


class BatchObject(Struct, kw_only=True):
    id: str
    object: str = "batch"
    endpoint: str
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str
    status: Literal[
        "validating", "in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled"
    ]
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts
    metadata: dict[str, str] | None = None


class BatchList(Struct, kw_only=True):
    object: str = "list"
    data: list[BatchObject]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False
