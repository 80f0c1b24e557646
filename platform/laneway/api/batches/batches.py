"""/v1/batches, as OpenAI defines it: create (the input file checked at once, api/batches/
validate.py), get, list (`after` / `limit`), cancel. A tenant sees only its own batches;
another tenant's is answered as missing (404). The lines run in the background
(api/batches/runner.py, on any replica)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from laneway.api import openapi
from laneway.api.batches.services import BatchApi, batch_object, cursor_page, json_response
from laneway.api.batches.validate import check_request, parse_lines
from laneway.api.batches.wire import BatchList, BatchObject, CreateBatchRequest
from laneway.api.request import authenticate, decode
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError, invalid_request
from laneway.core.auth import KeyAuthenticator, hash_secret
from litestar import Controller, Request, Response, get, post
from litestar.params import FromPath, FromQuery

BATCH_ERRORS = (400, 401, 403, 404, 500, 503)
METADATA_KEYS, METADATA_KEY_LEN, METADATA_VALUE_LEN = 16, 64, 512


def missing(batch_id: str) -> GatewayError:
    return GatewayError(ErrorCode.NOT_FOUND, f"No such Batch object: {batch_id[:80]}", param="batch_id")


def _check_metadata(metadata: dict[str, str] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > METADATA_KEYS:
        raise invalid_request(f"`metadata` may have at most {METADATA_KEYS} keys.", param="metadata")
    for key, value in metadata.items():
        if len(key) > METADATA_KEY_LEN or len(value) > METADATA_VALUE_LEN or "\x00" in key + value:
            raise invalid_request(
                f"`metadata` keys have at most {METADATA_KEY_LEN} characters and values at most "
                f"{METADATA_VALUE_LEN}, without NUL.",
                param="metadata",
            )


class BatchesController(Controller):
    path = "/v1/batches"
    security = openapi.API_KEY

    @post(
        "/",
        status_code=200,
        operation_class=openapi.operation(openapi.Wire(BatchObject, request=CreateBatchRequest, errors=BATCH_ERRORS)),
    )
    async def create(self, request: Request, batch_api: BatchApi) -> Response[bytes]:  # type: ignore[type-arg]
        api = batch_api.api
        tenant = await authenticate(request, api.authenticator)
        req = await decode(request, CreateBatchRequest)
        check_request(req.endpoint, req.completion_window)
        _check_metadata(req.metadata)
        store = batch_api.store
        info = await store.get_file(tenant.id, req.input_file_id)
        if info is None:
            raise GatewayError(
                ErrorCode.NOT_FOUND, f"No such File object: {req.input_file_id[:80]}", param="input_file_id"
            )
        if info.purpose != "batch":
            raise invalid_request(
                f"The file {info.id} has purpose '{info.purpose}'; a batch's input needs 'batch'.",
                param="input_file_id",
            )
        content = await store.file_content(tenant.id, req.input_file_id) or b""
        known = frozenset(api.gateway.registry.aliases())
        model, items = await asyncio.to_thread(
            parse_lines, content, req.endpoint, tenant, known.__contains__, batch_api.limits
        )
        key = hash_secret(KeyAuthenticator.bearer(request.headers.get("authorization")))
        expires = datetime.now(UTC) + timedelta(seconds=batch_api.window_s)
        batch = await store.create_batch(
            tenant.id,
            key,
            req.endpoint,
            req.input_file_id,
            req.completion_window,
            req.metadata,
            expires,
            items,
            model=model,
        )
        batch_api.kick()
        return json_response(batch_object(batch))

    @get("/", operation_class=openapi.operation(openapi.Wire(BatchList, errors=(400, 401, 403, 500, 503))))
    async def list_batches(
        self,
        request: Request,  # type: ignore[type-arg]
        batch_api: BatchApi,
        after: FromQuery[str | None] = None,
        limit: FromQuery[int] = 20,
    ) -> Response[bytes]:
        tenant = await authenticate(request, batch_api.api.authenticator)
        if not 1 <= limit <= 100:
            raise invalid_request("`limit` must be between 1 and 100.", param="limit")
        rows = await batch_api.store.list_batches(tenant.id, after=after, limit=limit + 1)
        return json_response(BatchList(**cursor_page([batch_object(b) for b in rows], limit)))

    @get("/{batch_id:str}", operation_class=openapi.operation(openapi.Wire(BatchObject, errors=BATCH_ERRORS)))
    async def get_batch(self, request: Request, batch_api: BatchApi, batch_id: FromPath[str]) -> Response[bytes]:  # type: ignore[type-arg]
        tenant = await authenticate(request, batch_api.api.authenticator)
        batch = await batch_api.store.get_batch(tenant.id, batch_id)
        if batch is None:
            raise missing(batch_id)
        return json_response(batch_object(batch))

    @post(
        "/{batch_id:str}/cancel",
        status_code=200,
        operation_class=openapi.operation(openapi.Wire(BatchObject, errors=BATCH_ERRORS)),
    )
    async def cancel(self, request: Request, batch_api: BatchApi, batch_id: FromPath[str]) -> Response[bytes]:  # type: ignore[type-arg]
        tenant = await authenticate(request, batch_api.api.authenticator)
        batch = await batch_api.store.cancel(tenant.id, batch_id)
        if batch is None:
            raise missing(batch_id)
        batch_api.kick()
        return json_response(batch_object(batch))
