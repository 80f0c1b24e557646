"""A stream survives its replica (issue 39): 40 concurrent streamed chats of 80 tokens over three
vLLM-protocol replicas, each a process of its own (tests/standins/vllm_process.py speaking a
deterministic model: each word chosen by the word before it, so a continued answer is word for
word an unbroken one, and every stream's whole answer is known before it is sent). When the
clients have received about half their tokens, the replica holding the most streams is
SIGKILLed (its connections drop) or SIGSTOPped (frozen: caught by the deployments'
`inter_token_timeout_s`).

Per row, on a fresh `laneway serve` (its own database in a private PostgreSQL cluster, its own
redis-server) and three fresh replicas:

- whole: the stream came back as the answer it should be: its text equal to the expected one
  (no word twice, none missing), one `id`, one `finish_reason` (`length`), one final usage chunk
  whose completion_tokens are the words received, and `[DONE]` last;
- cut: it ended with an error event (never a clean `[DONE]` after a cut);
- wrong: anything else (a duplicate, a gap, two ids, two usages, ...): must be 0;
- on the broken replica: streams it held when it broke (from its own request log);
- seam: for those streams, the longest wait between two content chunks the client saw, p50 / p99
  (after a SIGSTOP it includes the inter-token timeout), and the gateway's own
  `laneway_continuation_seam_seconds` mean (failure seen -> next replica's first token);
- leaked after settle, and usage rows matching what the clients were sent (completion_tokens
  equal to the usage chunk; `continuations` > 0 exactly on continued streams).

The baseline rows run the same fault with continuation off (LANEWAY_CONTINUATION=false), in the
same run. The retry budget's minimum is raised to 50 in every row but one (a replica dying
under 14 streams asks its deployment for 14 moves at once; the default minimum, 3 a 10 s
window, lets only 3 of them continue: the row "default retry budget" shows it).

Run: .venv/bin/python bench/continuation.py [--only KEY ...] [--streams 40] [--tokens 80]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from faults_harness import ROOT, gateway, metrics, settle
from faults_replicas import Replica, deployment
from support import PrivatePostgres, wait_for

sys.path.insert(0, str(ROOT / "tests"))
from continuation_streams import (
    ALIAS,
    LANES,
    Kind,
    Result,
    Stream,
    drive,
    ms,
    pct,
    rows_match,
    seam_bucket,
    signal_now,
    usage_of,
)
from standins.vllm_server import _markov  # the stand-in's own model: the expected answers

INTER_TOKEN_TIMEOUT_S = 1.0
TOKEN_DELAY_S = 0.03  # per chunk of the stand-in: 80 tokens take ~2.4 s, time enough to find them half done


def body_of(i: int, tokens: int) -> dict[str, Any]:
    return {
        "model": ALIAS,
        "messages": [{"role": "user", "content": f"question {i} tell me a long story"}],
        "max_tokens": tokens,
        "temperature": 0,
        "seed": i,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def expected_answer(body: dict[str, Any]) -> str:
    return "".join(_markov(body, 0))


class LlamaReplica(Replica):
    """SmolLM2 on llama.cpp behind vLLM's HTTP surface (bench/replica_server.py), a process of
    its own: one request computed at a time, the rest queued. The stand-in's Replica but for
    the process it starts (its health wait and SIGKILL are the same)."""

    def __init__(self, model: Path) -> None:
        self.model = model
        super().__init__()

    def start(self) -> None:
        script = str(Path(__file__).with_name("replica_server.py"))
        flags = ["--port", str(self.port), "--served-name", ALIAS, "--threads", "1", "--n-ctx", "1024"]
        self.proc = subprocess.Popen(
            [sys.executable, script, "--model", str(self.model), *flags],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(self._up, what=f"replica_server on port {self.port}", within=120)


def standin_kind(n: int, tokens: int) -> Kind:
    def start() -> Replica:
        r = Replica(TOKEN_DELAY_S)
        r.control(markov=True)
        return r

    bodies = [body_of(i, tokens) for i in range(n)]
    return Kind(
        f"stand-in, {n} x {tokens} tokens",
        start,
        bodies,
        lambda: [Stream(i, expected_answer(b)) for i, b in enumerate(bodies)],
        lambda streams: all(s.chunks for s in streams),  # every stream bound to its replica and under way
        # Armed: the stand-in sends itself the signal when a stream of its own has half its
        # tokens (all of its streams began together). Timed by the clients, a loaded machine's
        # lagging client put the fault after the replicas had generated everything.
        lambda replica, signum: replica.control(signal_at_tokens=tokens // 2, signal_number=signum),
        INTER_TOKEN_TIMEOUT_S,
    )


def run_row(
    pg: PrivatePostgres | None,
    work: Path,
    name: str,
    signum: int | None,
    settings: dict[str, str],
    kind: Kind,
) -> Result:
    replicas = [kind.start() for _ in range(3)]
    try:
        deployments = []
        for i, r in enumerate(replicas):
            d = deployment(f"{ALIAS}-{i}", r)
            d["config"].update(inter_token_timeout_s=kind.inter_token_timeout_s, max_concurrency=64)
            d["max_model_len"] = kind.max_model_len
            if kind.first_token_timeout_s is not None:
                d["config"]["first_token_timeout_s"] = kind.first_token_timeout_s
            deployments.append(d)
        env_settings = {"LANEWAY_RETRY_BUDGET_MIN": "50", **settings}
        with gateway(pg, work, models={ALIAS: deployments}, lanes=LANES, ready_within=300, **env_settings) as env:
            streams = kind.streams()
            broken, fault_at = asyncio.run(drive(env, replicas, signum, streams, kind))
            for r in replicas:  # a frozen replica thawed: its sockets close, nothing more reaches a client
                if r.proc is not None and r.proc.poll() is None:
                    os.kill(r.proc.pid, signal.SIGCONT)
            result = Result(f"{kind.label}: {name}", streams, set(), fault_at)
            settle(env, result.row)
            m = metrics(env)
            count = m.get("laneway_continuation_seam_seconds_count", 0.0)
            result.continuations = int(m.get("laneway_continuations_total", 0.0))
            if count:
                result.seam_server_mean = m["laneway_continuation_seam_seconds_sum"] / count
                result.seam_server_p50, result.seam_server_p99 = (seam_bucket(env, q) for q in (0.5, 0.99))
            rows = asyncio.run(usage_of(env))
            if broken is not None:  # the streams it failed: moved before their first token, continued or cut
                gone = f"{ALIAS}-{broken}"
                result.broken_held = {
                    rid
                    for rid, row in rows.items()
                    if gone in (row["failed_deployments"] or "").split(",")
                    or (row["deployment"] == gone and row["status"] != 200)
                }
            result.continued = {rid for rid, row in rows.items() if row["continuations"]}
            result.rows_match = rows_match(streams, rows)
    finally:
        for r in replicas:
            r.kill()
    return result


SIGKILL, SIGSTOP = signal.SIGKILL.value, signal.SIGSTOP.value
ROWS: dict[str, tuple[str, int | None, dict[str, str]]] = {
    "none": ("no fault", None, {}),
    "kill-off": ("SIGKILL busiest, continuation off (baseline)", SIGKILL, {"LANEWAY_CONTINUATION": "false"}),
    "kill": ("SIGKILL busiest, continuation on", SIGKILL, {}),
    "kill-budget": (
        "SIGKILL busiest, continuation on, default retry budget (min 3)",
        SIGKILL,
        {"LANEWAY_RETRY_BUDGET_MIN": "3"},
    ),
    "stop-off": ("SIGSTOP busiest, continuation off (baseline)", SIGSTOP, {"LANEWAY_CONTINUATION": "false"}),
    "stop": ("SIGSTOP busiest, continuation on", SIGSTOP, {}),
}
LLAMA_ROWS = ["none", "kill-off", "kill", "stop"]  # with --smollm2, after the stand-in rows
ASKED = [
    "Write a short story about a cat who learns to fly.",
    "Explain how a bicycle works, step by step.",
    "List ten facts about the moon.",
    "Describe a walk through a forest in autumn.",
    "Explain what a compiler does, in simple words.",
    "Write a letter to a friend about a trip to the sea.",
]


def smollm2_kind(model: Path, n: int, tokens: int, reference: list[Stream] | None) -> Kind:
    """SmolLM2 replicas: greedy answers, each expected to be the no-fault row's (`reference`;
    None: this is that row, and its own texts are kept as they come)."""
    bodies = [
        {
            "model": ALIAS,
            "messages": [{"role": "user", "content": ASKED[i % len(ASKED)] + f" (#{i})"}],
            "max_tokens": tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        for i in range(n)
    ]

    def streams() -> list[Stream]:
        if reference is None:
            return [Stream(i, "") for i in range(n)]
        return [Stream(i, r.text, r.finishes[0] if r.finishes else "length") for i, r in enumerate(reference)]

    return Kind(
        f"SmolLM2, {n} x {tokens} tokens",
        lambda: LlamaReplica(model),
        bodies,
        streams,
        lambda streams: max(s.chunks for s in streams) >= tokens // 2,  # the first answers half done
        signal_now,
        2.0,
        max_model_len=384,  # the warm-up prefills half of it on each replica, one at a time
        first_token_timeout_s=60.0,  # one at a time: a stream queued behind five others waits for them
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", choices=list(ROWS), help="the stand-in rows to run (default: all)")
    ap.add_argument("--streams", type=int, default=40)
    ap.add_argument("--tokens", type=int, default=80)
    ap.add_argument("--smollm2", type=Path, help="SmolLM2's GGUF: also run its rows on bench/replica_server.py")
    ap.add_argument("--smollm2-streams", type=int, default=6)
    ap.add_argument("--smollm2-tokens", type=int, default=100)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lw-cont-"))
    try:
        pg: PrivatePostgres | None = PrivatePostgres(Path(tempfile.mkdtemp(prefix="lw-pg-"))).start()
        database = "a private PostgreSQL cluster"
    except BaseException as exc:  # no initdb here: SQLite
        pg, database = None, f"SQLite (private PostgreSQL unavailable: {exc})"
    print(
        f"# bench/continuation.py on {platform.node()} ({os.cpu_count()} CPUs, Python {platform.python_version()}); "
        f"3 replica processes per row: vLLM-protocol stand-ins ({TOKEN_DELAY_S * 1000:.0f} ms a token, "
        f"inter_token_timeout_s {INTER_TOKEN_TIMEOUT_S:g}) or SmolLM2 on bench/replica_server.py "
        f"(inter_token_timeout_s 2); database: {database}"
    )
    results: list[Result] = []
    try:
        standin = standin_kind(args.streams, args.tokens)
        for key in args.only if args.only is not None else list(ROWS):
            name, fault, settings = ROWS[key]
            results.append(run_row(pg, work, name, fault, settings, standin))
            print(f"  done: {key}", file=sys.stderr)
        if args.smollm2 is not None:
            reference: list[Stream] | None = None
            for key in LLAMA_ROWS:
                name, fault, settings = ROWS[key]
                kind = smollm2_kind(args.smollm2, args.smollm2_streams, args.smollm2_tokens, reference)
                result = run_row(pg, work, name, fault, settings, kind)
                if reference is None:
                    reference = result.streams
                    for s in reference:
                        s.expected, s.expected_finish = s.text, s.finishes[0] if s.finishes else "length"
                results.append(result)
                print(f"  done: smollm2 {key}", file=sys.stderr)
    finally:
        if pg is not None:
            pg.stop()
        shutil.rmtree(work, ignore_errors=True)
    print_table(results)


def print_table(results: list[Result]) -> None:
    print(
        "| row | whole | cut (error event) | refused before the first byte | wrong | on the broken replica: "
        "whole / moved or cut | replica chosen at (clients' mean tokens) "
        "| continued: client's longest gap p50 / p99 (ms) | others: "
        "longest gap p50 (ms) | seam, gateway p50 / p99 / mean (ms) | continuations | leaked | usage rows stored / "
        "leases | rows bill what was sent |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        n = len(r.streams)
        whole = sum(s.whole for s in r.streams)
        cut = sum(s.cut for s in r.streams)
        refused = sum(s.status != 200 for s in r.streams)
        wrong = n - whole - cut - refused
        on = [s for s in r.streams if s.request_id in r.broken_held]
        seam = [s.longest_gap() for s in r.streams if s.request_id in r.continued and s.finishes]
        normal = [s.longest_gap() for s in r.streams if s.request_id not in r.broken_held and s.whole]
        held = f"{sum(s.whole for s in on)} / {len(on)}" if r.broken_held else "-"
        gateway_seam = f"{r.seam_server_p50} / {r.seam_server_p99} / {ms(r.seam_server_mean)}"
        print(
            f"| {r.name} | {whole}/{n} | {cut} | {refused} | {wrong} | {held} | {r.fault_at_tokens:.0f} "
            f"| {ms(pct(seam, 0.5))} / {ms(pct(seam, 0.99))} | {ms(pct(normal, 0.5))} | {gateway_seam} "
            f"| {r.continuations} | {r.row.leaked} | {r.row.rows_stored} / {r.row.rows_expected} | {r.rows_match} |"
        )
    for r in results:
        odd = [s for s in r.streams if not s.whole and not s.cut]
        for s in odd[:3]:
            differs = next((k for k, (a, b) in enumerate(zip(s.text, s.expected, strict=False)) if a != b), None)
            seam = s.seam_at() if s.request_id in r.continued else None
            print(
                f"  {r.name}: stream {s.index}: status {s.status}, {len(s.ids)} ids, finishes {s.finishes}, "
                f"{len(s.usages)} usages, last {s.last[:60]!r}, said {s.error!r}; text equal: "
                f"{s.text == s.expected}, first difference at char {differs} of {len(s.expected)} (the seam: "
                f"char {seam}): "
                f"{s.text[max(0, (differs or 0) - 30) : (differs or 0) + 30]!r} vs "
                f"{s.expected[max(0, (differs or 0) - 30) : (differs or 0) + 30]!r}"
            )


if __name__ == "__main__":
    main()
