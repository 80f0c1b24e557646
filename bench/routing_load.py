"""bench/routing.py's load generator, a process of its own (the router under test and the
bench's own bookkeeping never share its event loop):

    python bench/routing_load.py SPEC.json RESULT.json

Open loop: each request (or each session's first turn) is sent at its scheduled time whatever
the router does, and its TTFT and end-to-end time count from that time, not from when the
generator got round to it. A session's next turn is sent when its previous answer has arrived
and the user's pause after it (`think`, seconds, one per later turn) is over, with that answer
in its history; its times count from that send. The client is the official openai SDK (AsyncOpenAI), streamed
chat with the usage chunk; a request that raises, ends without finishing, or is still running
`drain_s` after the last arrival counts as failed.

SPEC: {"base_url", "api_key", "model", "timeout_s", "drain_s", "prompt_cache_key": bool,
"requests": [{"at", "messages", "max_tokens"}], "sessions": [{"at", "id", "system", "turns",
"think", "max_tokens"}]}. RESULT: {"records": [{"ttft", "e2e", "tokens", "error"}], "span_s", "late_ms"}.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from openai import AsyncOpenAI


class Run:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.client = AsyncOpenAI(
            base_url=spec["base_url"], api_key=spec["api_key"], max_retries=0, timeout=spec["timeout_s"]
        )
        self.records: list[dict[str, Any]] = []
        self.late: list[float] = []
        self.start = 0.0
        self.last_end = 0.0

    async def one(
        self, messages: list[dict[str, str]], max_tokens: int, scheduled: float, session: str | None = None
    ) -> str | None:
        """One streamed chat; its record; the answer's text (None if it failed)."""
        record: dict[str, Any] = {"ttft": None, "e2e": None, "tokens": 0, "error": None}
        self.records.append(record)
        extra: dict[str, Any] = {}
        if session is not None and self.spec.get("prompt_cache_key"):
            extra["prompt_cache_key"] = session
        parts: list[str] = []
        finished = False
        chunks = 0
        try:
            stream = await self.client.chat.completions.create(
                model=self.spec["model"],
                messages=messages,
                max_tokens=max_tokens,
                temperature=0,
                stream=True,  # type: ignore[arg-type]
                stream_options={"include_usage": True},
                **extra,
            )
            async for chunk in stream:
                if chunk.usage is not None:
                    record["tokens"] = chunk.usage.completion_tokens
                for choice in chunk.choices:
                    if choice.delta.content:
                        if record["ttft"] is None:
                            record["ttft"] = time.perf_counter() - scheduled
                        parts.append(choice.delta.content)
                        chunks += 1
                    finished = finished or choice.finish_reason is not None
        except asyncio.CancelledError:
            record["error"] = "still running at the end of the drain"
            raise
        except Exception as exc:  # every failure counts; its kind is kept for the report
            record["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            return None
        if not finished:
            record["error"] = "stream ended without a finish_reason"
            return None
        now = time.perf_counter()
        record["e2e"] = now - scheduled
        record["tokens"] = record["tokens"] or chunks
        self.last_end = max(self.last_end, now)
        return "".join(parts)

    async def request(self, item: dict[str, Any]) -> None:
        scheduled = await self.wait_until(item["at"])
        await self.one(item["messages"], item["max_tokens"], scheduled)

    async def session(self, item: dict[str, Any]) -> None:
        scheduled = await self.wait_until(item["at"])
        history = [{"role": "system", "content": item["system"]}]
        pauses = [0.0, *item.get("think", [])]
        for turn, pause in zip(item["turns"], pauses, strict=False):
            if pause > 0:
                await asyncio.sleep(pause)
                scheduled = time.perf_counter()
            history.append({"role": "user", "content": turn})
            answer = await self.one(history, item["max_tokens"], scheduled, session=item["id"])
            if answer is None:
                return  # a failed turn ends its session: the next would send another history
            history.append({"role": "assistant", "content": answer})
            scheduled = time.perf_counter()

    async def wait_until(self, at: float) -> float:
        scheduled = self.start + at
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        self.late.append(max(0.0, time.perf_counter() - scheduled) * 1000)
        return scheduled

    async def main(self) -> dict[str, Any]:
        spec = self.spec
        self.start = time.perf_counter() + 0.2
        tasks = [asyncio.create_task(self.request(r)) for r in spec.get("requests", [])]
        tasks += [asyncio.create_task(self.session(s)) for s in spec.get("sessions", [])]
        last = max([r["at"] for r in spec.get("requests", [])] + [s["at"] for s in spec.get("sessions", [])] + [0.0])
        await asyncio.sleep(max(0.0, self.start + last - time.perf_counter()))
        _, pending = await asyncio.wait(tasks, timeout=spec["drain_s"]) if tasks else (set(), set())
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await self.client.close()
        span = (self.last_end or time.perf_counter()) - self.start
        return {"records": self.records, "span_s": span, "late_ms": max(self.late, default=0.0)}


def main() -> None:
    spec_path, result_path = sys.argv[1], sys.argv[2]
    with open(spec_path) as f:
        spec = json.load(f)
    result = asyncio.run(Run(spec).main())
    with open(result_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
