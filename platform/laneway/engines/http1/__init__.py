"""A lean HTTP/1.1 client for the engines laneway reaches over HTTP (vLLM's OpenAI server).

Why not aiohttp: its request path (the session, the connector's bookkeeping, the response's
StreamReader, timers per read) costs several times this client's CPU per request against the
same upstream (bench/upstream_client.py measures both), a cost every proxied request pays. The
upstream is one known server speaking HTTP/1.1 on keep-alive connections, so this client
does only that: one asyncio.Protocol per connection, llhttp (the C parser in `httptools`,
already here for uvicorn) for status, headers, chunked and content-length bodies, a bounded
pool of keep-alive connections, TLS for an `https` upstream (asyncio's, with the system's
trust store or a given context), and nothing else (no redirects, cookies, proxies or
compression).

Semantics the engine adapters rely on:
- Closing a response before its body has ended closes the connection (never reused): the
  engine sees its client leave and aborts the request (vLLM frees the sequence). A task
  cancelled while waiting for the answer's head does the same.
- A connection that the server closed while idle in the pool (its keep-alive timeout) is
  dropped; a request that finds it closed before any byte of the answer came back is sent
  once more on a fresh connection. Nothing else is retried.
- A read timeout (`read_timeout_s`: no byte from the server for that long, while an answer
  is awaited) and a connect timeout end the request with UpstreamTimeout; a connection
  refused, reset or closed mid-answer with UpstreamError. Both leave the pool consistent.
- At most `limit` connections; a request beyond them waits for one to be returned.
- A body that arrives faster than it is read pauses the socket past `high_water` bytes.

Modules: pool.py (Http1Pool: the connections and a request), connection.py (one connection,
parsed by llhttp), response.py (an answer and its body), errors.py.
"""

from laneway.engines.http1.errors import UpstreamError, UpstreamTimeout
from laneway.engines.http1.pool import Http1Pool
from laneway.engines.http1.response import Http1Response

__all__ = ["Http1Pool", "Http1Response", "UpstreamError", "UpstreamTimeout"]
