"""/v1/files, as OpenAI defines it, for batch input: upload (multipart, purpose=batch,
JSONL), list, get, download and delete. A tenant sees only its own files; another tenant's
is answered as missing (404), never as forbidden. Bodies are kept in the database, so every
replica serves every file (docs/batches.md has the limits)."""

from __future__ import annotations

from laneway.api import openapi
from laneway.api.batches.services import BatchApi, cursor_page, file_object, json_response
from laneway.api.batches.wire import FileDeleted, FileList, FileObject
from laneway.api.request import authenticate
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError, invalid_request
from litestar import Controller, Request, Response, delete, get, post
from litestar.datastructures import UploadFile
from litestar.params import FromPath, FromQuery

UPLOAD_LIMIT = 210 * 1024 * 1024  # the body: the 200 MB file and its multipart framing
FILE_ERRORS = (400, 401, 403, 404, 500, 503)


def missing(file_id: str) -> GatewayError:
    return GatewayError(ErrorCode.NOT_FOUND, f"No such File object: {file_id[:80]}", param="id")


class FilesController(Controller):
    path = "/v1/files"
    security = openapi.API_KEY

    @post(
        "/",
        status_code=200,
        request_max_body_size=UPLOAD_LIMIT,
        operation_class=openapi.operation(openapi.Wire(FileObject, errors=FILE_ERRORS)),
    )
    async def upload(self, request: Request, batch_api: BatchApi) -> Response[bytes]:  # type: ignore[type-arg]
        tenant = await authenticate(request, batch_api.api.authenticator)
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            raise invalid_request("Upload the file as multipart/form-data with `file` and `purpose`.", param="file")
        form = await request.form()
        purpose, upload = form.get("purpose"), form.get("file")
        if purpose != "batch":
            raise invalid_request(
                f"`purpose` must be 'batch' (laneway keeps files for batches only); got '{str(purpose)[:40]}'.",
                param="purpose",
            )
        if not isinstance(upload, UploadFile):
            raise invalid_request("Send the file's content as the multipart field `file`.", param="file")
        content = await upload.read()
        limit = batch_api.limits.max_bytes
        if len(content) > limit:
            raise invalid_request(
                f"The file has {len(content)} bytes; a batch input file may have at most {limit}.", param="file"
            )
        if not content.strip():
            raise invalid_request("The file is empty.", param="file")
        name = (upload.filename or "input.jsonl")[:255].replace("\x00", "")
        info = await batch_api.store.create_file(tenant.id, "batch", name, content)
        return json_response(file_object(info))

    @get("/", operation_class=openapi.operation(openapi.Wire(FileList, errors=(400, 401, 403, 500, 503))))
    async def list_files(
        self,
        request: Request,  # type: ignore[type-arg]
        batch_api: BatchApi,
        purpose: FromQuery[str | None] = None,
        after: FromQuery[str | None] = None,
        limit: FromQuery[int] = 10_000,
        order: FromQuery[str] = "desc",
    ) -> Response[bytes]:
        tenant = await authenticate(request, batch_api.api.authenticator)
        if not 1 <= limit <= 10_000:
            raise invalid_request("`limit` must be between 1 and 10000.", param="limit")
        if order not in ("asc", "desc"):
            raise invalid_request("`order` must be 'asc' or 'desc'.", param="order")
        rows = await batch_api.store.list_files(tenant.id, purpose=purpose, after=after, limit=limit + 1, order=order)
        return json_response(FileList(**cursor_page([file_object(f) for f in rows], limit)))

    @get("/{file_id:str}", operation_class=openapi.operation(openapi.Wire(FileObject, errors=FILE_ERRORS)))
    async def get_file(self, request: Request, batch_api: BatchApi, file_id: FromPath[str]) -> Response[bytes]:  # type: ignore[type-arg]
        tenant = await authenticate(request, batch_api.api.authenticator)
        info = await batch_api.store.get_file(tenant.id, file_id)
        if info is None:
            raise missing(file_id)
        return json_response(file_object(info))

    @get("/{file_id:str}/content", operation_class=openapi.operation(openapi.Wire(None, errors=FILE_ERRORS)))
    async def content(self, request: Request, batch_api: BatchApi, file_id: FromPath[str]) -> Response[bytes]:  # type: ignore[type-arg]
        tenant = await authenticate(request, batch_api.api.authenticator)
        body = await batch_api.store.file_content(tenant.id, file_id)
        if body is None:
            raise missing(file_id)
        return Response(body, media_type="application/octet-stream")

    @delete(
        "/{file_id:str}",
        status_code=200,
        operation_class=openapi.operation(openapi.Wire(FileDeleted, errors=FILE_ERRORS)),
    )
    async def delete_file(self, request: Request, batch_api: BatchApi, file_id: FromPath[str]) -> Response[bytes]:  # type: ignore[type-arg]
        tenant = await authenticate(request, batch_api.api.authenticator)
        if not await batch_api.store.delete_file(tenant.id, file_id):
            raise missing(file_id)
        return json_response(FileDeleted(id=file_id))
