"""POST /v1/responses: OpenAI's Responses API on the chat pipeline (handler.py); the wire
types (protocol.py), the request as chat (request.py), the answer as output items and named
events (assembler.py)."""
