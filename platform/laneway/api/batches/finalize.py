"""A batch's end: its output file (the lines answered 2xx, in input order) and its error
file (every other answer, and a line for each request that never ran), then its final
status. Any replica may do it, once: the store gives each finished batch to one owner under
a lease, and a redo after a crash replaces the files it wrote."""

from __future__ import annotations

import asyncio

from laneway.api.batches.lines import not_run
from laneway.contracts.codes import ErrorCode
from laneway.db.batch_store import BatchStore

NOT_RUN = {  # a line's state -> its error file line (OpenAI's codes for lines that never ran)
    "expired": (
        ErrorCode.BATCH_EXPIRED,
        "This request could not be executed before the completion window expired.",
    ),
    "cancelled": (ErrorCode.BATCH_CANCELLED, "This request was not executed: the batch was cancelled."),
}


async def finalize(store: BatchStore, owner: str, batch_id: str) -> None:
    info = await store.get_batch(None, batch_id)
    if info is None:
        return
    lines = await store.output_lines(batch_id)
    output, errors = await asyncio.to_thread(_files, [(x.custom_id, x.state, x.result) for x in lines])
    if info.cancelling_at is not None:
        status = "cancelled"
    elif any(x.state == "expired" for x in lines):
        status = "expired"
    else:
        status = "completed"
    await store.complete(batch_id, owner, status, output, errors)


def _files(lines: list[tuple[str, str, str | None]]) -> tuple[bytes | None, bytes | None]:
    output: list[bytes] = []
    errors: list[bytes] = []
    for custom_id, state, result in lines:
        if state == "succeeded" and result is not None:
            output.append(result.encode())
        elif state == "failed" and result is not None:
            errors.append(result.encode())
        elif state in NOT_RUN:
            errors.append(not_run(custom_id, *NOT_RUN[state]))
    return (b"\n".join(output) + b"\n" if output else None), (b"\n".join(errors) + b"\n" if errors else None)
