"""The ASGI scope keys the server sets on a request for the layers below it."""

from __future__ import annotations

RECEIVED_AT = "laneway.received_at"  # when the request's headers were parsed (time.perf_counter)
PREPARING = "laneway.preparing"  # an API request's load_shedding.Preparing token
