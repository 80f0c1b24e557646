"""Names the layers share on a request's ASGI scope and headers: the server sets some, the API
reads them, tracing and the error handlers read others. Strings only, so that no layer has to
import another's module for a key."""

from __future__ import annotations

REQUEST_ID_HEADER = b"x-request-id"
CALL_KEY = "laneway.call"  # the admitted Call, set when its lease is opened
REQUEST_ID_KEY = "laneway.request_id"  # the id of a request that has no call
TRACE_KEY = "laneway.trace"  # the request's RequestTrace, only while tracing is on
RECEIVED_AT = "laneway.received_at"  # perf_counter() when the server parsed the request's headers
PREPARING = "laneway.preparing"  # an API request's load_shedding.Preparing token
# A batch line run in-process (api/batches/): its tenant, authenticated when the batch was
# created, and the mark that sends it to the background lane. Never set from the wire.
TENANT_KEY = "laneway.tenant"
BACKGROUND_KEY = "laneway.background"

# ASGI extensions the server offers the app (scope["extensions"][name]).
DISCONNECT_EXTENSION = "laneway.watch_disconnect"  # a callback when the client's socket closes
ABORT_EXTENSION = "laneway.abort"  # close the connection without a clean end (a cut stream)
