"""Proxy overhead: the same streamed requests straight to a scripted engine vs through the capture proxy.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/proxy_overhead.py            # c = 1, 8, 64; ~8 min
    .venv/bin/python benchmarks/proxy_overhead.py --concurrency 1 8 --calls 40 160   # a quicker look
    .venv/bin/python benchmarks/proxy_overhead.py --concurrency 1 --calls 60 --paths direct streamed --profile
    # before/after in one run: the streamed proxy of another checkout (here HEAD) beside this one's, ~7 min
    git worktree add --detach /tmp/wb-proxy-base HEAD
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/proxy_overhead.py --concurrency 1 --calls 200 \
        --paths direct streamed --baseline /tmp/wb-proxy-base
    git worktree remove /tmp/wb-proxy-base

Three processes besides this one (the load generator, an aiohttp client): a fast scripted engine that
speaks vLLM 0.32's dialect (streamed: a role chunk with ``prompt_token_ids``, one chunk per token with
``token_ids`` and ``logprobs.content`` entries ``token_id:N``, a usage chunk, ``[DONE]``; unstreamed:
the same answer as one JSON body), and two `CaptureProxy` processes in front of it: ``openenv``
(``stream_upstream=False``: OpenEnv's `CaptureServer` path, which asks the engine for the whole answer
and replays it as one chunk) and ``streamed`` (the default: `workbench.capture.stream`). The request is
the real opencode agent call shipped in ``workbench/data/rollouts/tiny-humaneval`` (30 KB: the 9.6k-
character system prompt, 9 tools), and the engine answers with that call's 7,097 prompt ids and its
first ``--tokens`` sampled ids and logprobs. The engine is paced like a serving engine: the first token
after ``--ttft-ms``, then one every ``--itl-ms`` (a GPU engine's decode step); it spends next to no CPU.

``--paths`` picks some of them; ``--baseline DIR`` adds ``streamed-base``: the same streamed proxy served by
this script with the ``workbench`` package of the checkout DIR (a commit to compare against), so that before and
after are measured side by side in one run, under the same load. Each proxy process freezes its start-up
objects (`CaptureProxy.freeze_startup_objects`) as ``workbench proxy`` does.

``--profile`` says where a call's time goes: the streamed proxy stamps each stage of a call (request parsed, prepared,
written upstream, the engine's headers back, the first chunk relayed, [DONE] relayed, the turn ingested, the call
settled), and at one stream the scripted engine and the client stamp too (the request's arrival, the last write;
sending, reading [DONE]), all on CLOCK_MONOTONIC, which every process shares: the hops around the engine, direct
and proxied, and the proxied request hop cut in three (`timeline`). The stamps are wrappers installed in the
benchmark's own proxy process (a clock read and a dict store each).

Each path runs the same closed loop: ``c`` concurrent streams, each sending its next call when the last
one ended, a new session key every 10 calls (a rollout's worth; keys minted outside the timed blocks), the
streams' starts staggered over one call's length (every scripted call lasts the same, so streams started
together would stay in lockstep and hit the proxy in bursts of ``c``).
Blocks of the three paths are interleaved (rotating order), so a noisy machine slows all three alike;
fresh proxies per concurrency. Per call: end-to-end latency (request to the end of the stream) and time
to first chunk (to the first ``data:`` line). Per path: calls/s over its blocks, and the proxy's CPU per
call (all its threads, from /proc/PID/task/*/schedstat). Prints a table and writes
a new benchmarks/results/proxy_overhead/<date>_<host>.json per run (benchmarks/run_file.py: never an earlier run's file) (every block's raw
numbers included).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import datetime as dt
import json
import os
import platform
import re
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # run_file
from run_file import host, new_run_file

FIXTURE = ROOT / "workbench" / "data" / "rollouts" / "tiny-humaneval" / "trace.json"
PATHS = ("direct", "openenv", "streamed")
BASELINE = "streamed-base"  # --baseline: the streamed proxy of another checkout
SESSION_CALLS = 10  # calls per session key: one rollout's worth
_STREAM = re.compile(rb'"stream"\s*:\s*true')


def _agent_call() -> dict[str, Any]:
    calls = json.loads(FIXTURE.read_text())
    return next(c for c in calls if c["purpose"] == "agent")


def _request_body() -> bytes:
    call = _agent_call()
    body = {
        "model": "tiny",
        "max_tokens": 4096,
        "messages": call["request"]["messages"],
        "tools": call["request"]["tools"],
        "tool_choice": "auto",
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return json.dumps(body).encode()


# -- the scripted engine ----------------------------------------------------------------------------


def _engine_answers(tokens: int) -> tuple[bytes, list[bytes], bytes]:
    """(first streamed chunk, the other streamed chunks, the unstreamed JSON body), built once."""
    call = _agent_call()
    prompt, out = call["prompt_token_ids"], call["completion_token_ids"][:tokens]
    lps = call["per_token_logps"][:tokens]
    pieces = [f" w{i}" for i in range(len(out))]
    head = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1, "model": "tiny"}

    def entry(t: int, lp: float) -> dict[str, Any]:
        return {"token": f"token_id:{t}", "logprob": lp, "bytes": [32], "top_logprobs": []}

    role = {
        **head,
        "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        ],
        "prompt_token_ids": prompt,
    }
    token_chunks = [
        {
            **head,
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": p},
                    "logprobs": {"content": [entry(t, lp)]},
                    "finish_reason": "stop" if i == len(out) - 1 else None,
                    "token_ids": [t],
                }
            ],
        }
        for i, (p, t, lp) in enumerate(zip(pieces, out, lps))
    ]
    usage = {"prompt_tokens": len(prompt), "completion_tokens": len(out), "total_tokens": len(prompt) + len(out)}
    sse = [f"data: {json.dumps(c, separators=(',', ':'))}\n\n".encode() for c in [role, *token_chunks]]
    tail = f"data: {json.dumps({**head, 'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode()
    whole = {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1,
        "model": "tiny",
        "prompt_token_ids": prompt,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "".join(pieces), "tool_calls": []},
                "finish_reason": "stop",
                "token_ids": out,
                "logprobs": {"content": [entry(t, lp) for t, lp in zip(out, lps)]},
            }
        ],
        "usage": usage,
    }
    return sse[0] + sse[1], sse[2:] + [tail], json.dumps(whole).encode()


def serve_engine(tokens: int, ttft_s: float, itl_s: float, profile: str = "") -> None:
    """A minimal HTTP/1.1 server on asyncio: keep-alive, chunked SSE, everything precomputed. With `profile` (a
    file), each streamed request's arrival (its body read) and its last write are stamped, written there on
    SIGTERM."""
    first, rest, whole = _engine_answers(tokens)
    stamps: list[tuple[int, int]] = []
    if profile:

        def dump(*_: object) -> None:
            Path(profile).write_text(json.dumps(stamps))
            os._exit(0)

        signal.signal(signal.SIGTERM, dump)
    models = json.dumps({"object": "list", "data": [{"id": "tiny", "object": "model"}]}).encode()

    def chunk(data: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(data), data)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, *lines = head.split(b"\r\n")
                length = next((int(x.split(b":", 1)[1]) for x in lines if x.lower().startswith(b"content-length:")), 0)
                body = await reader.readexactly(length) if length else b""
                if request_line.startswith(b"GET"):
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                        % (len(models), models)
                    )
                elif _STREAM.search(body):
                    # Each chunk at its own deadline from the request's arrival (not sleep after sleep,
                    # whose overshoots would add up): streamed and unstreamed answers end together.
                    t0, arrived = loop.time(), time.perf_counter_ns()
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                    )
                    await asyncio.sleep(t0 + ttft_s - loop.time())
                    writer.write(chunk(first))
                    for k, data in enumerate(rest[:-1], 1):
                        await asyncio.sleep(t0 + ttft_s + k * itl_s - loop.time())
                        writer.write(chunk(data))
                    last = time.perf_counter_ns()
                    writer.write(chunk(rest[-1]) + b"0\r\n\r\n")
                    if profile:
                        stamps.append((arrived, last))
                else:  # the whole answer when the last token would have been sampled
                    await asyncio.sleep(ttft_s + (len(rest) - 1) * itl_s)
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                        % (len(whole), whole)
                    )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=512)
        print(server.sockets[0].getsockname()[1], flush=True)
        await server.serve_forever()

    asyncio.run(main())


# --profile: where a proxied call's time goes, stamped inside the proxy process (perf_counter_ns) at the edges of
# each stage of the streamed path. Wrappers around the stage functions, installed in the benchmark's proxy process
# only; each adds a clock read and a dict store (~0.2 us), nothing else changes.
STAGES = (
    ("in", "parsed", "request read + parsed (uvicorn done -> body parsed)"),
    ("parsed", "prepared", "checks, call record, transform, prepare"),
    ("prepared", "sent", "aiohttp request written to the engine"),
    ("sent", "headers", "engine's response headers back (engine's own share included)"),
    ("first_in", "first_out", "first chunk (prompt ids) parsed, folded, rewritten, relayed"),
    ("done_in", "done_out", "last chunks + [DONE] relayed"),
    ("done_out", "ingested", "turn ingested (after [DONE]: the client's next request waits behind it)"),
    ("ingested", "finished", "call settled (fidelity of the raw request)"),
)


def _install_profile() -> list[dict[str, int]]:
    import contextvars
    from time import perf_counter_ns

    from workbench.capture import proxy as proxy_mod
    from workbench.capture import record, relay, stream, upstream

    calls: list[dict[str, int]] = []
    current: contextvars.ContextVar[dict[str, int] | None] = contextvars.ContextVar("stamps", default=None)

    def stamp(name: str) -> None:
        rec = current.get()
        if rec is not None and name not in rec:
            rec[name] = perf_counter_ns()

    entry = proxy_mod.CaptureProxy.__call__

    async def call(self, scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] == "http" and scope["path"].endswith("/chat/completions"):
            rec = {"in": perf_counter_ns()}
            calls.append(rec)
            current.set(rec)
        return await entry(self, scope, receive, send)

    parse = proxy_mod._parse

    def parsed(*args):  # type: ignore[no-untyped-def]
        out = parse(*args)
        stamp("parsed")
        return out

    prepare = stream.StreamingPath.prepare

    def prepared(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        out = prepare(self, *args, **kwargs)
        stamp("prepared")
        return out

    post = upstream.aiohttp.ClientSession.post

    def posted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        inner = post(self, *args, **kwargs)

        async def run():  # type: ignore[no-untyped-def]
            response = await inner
            stamp("headers")
            return response

        return run()

    write = upstream.aiohttp.ClientRequest.send

    async def sent(self, conn):  # type: ignore[no-untyped-def]
        out = await write(self, conn)
        stamp("sent")
        return out

    feed = relay.StreamedTurn.feed

    def fed(self, chunk, model):  # type: ignore[no-untyped-def]
        stamp("first_in" if "prompt_token_ids" in chunk else "chunk")
        return feed(self, chunk, model)

    body = relay.Reply.body

    async def relayed(self, data, *, more=True):  # type: ignore[no-untyped-def]
        if not more:
            stamp("done_in")
        await body(self, data, more=more)
        stamp("first_out" if more else "done_out")

    ingest = stream.ingest

    def ingested(*args, **kwargs):  # type: ignore[no-untyped-def]
        out = ingest(*args, **kwargs)
        stamp("ingested")
        return out

    finish = record.CallRecorder.finish

    def finished(self):  # type: ignore[no-untyped-def]
        finish(self)
        stamp("finished")

    record.CallRecorder.finish = finished  # type: ignore[method-assign]
    proxy_mod.CaptureProxy.__call__ = call  # type: ignore[method-assign]
    proxy_mod._parse = parsed
    stream.StreamingPath.prepare = prepared  # type: ignore[method-assign]
    upstream.aiohttp.ClientSession.post = posted  # type: ignore[method-assign]
    upstream.aiohttp.ClientRequest.send = sent  # type: ignore[method-assign]
    relay.StreamedTurn.feed = fed  # type: ignore[method-assign]
    relay.Reply.body = relayed  # type: ignore[method-assign]
    stream.ingest = ingested
    return calls


def profile_summary(calls: list[dict[str, int]]) -> list[dict[str, Any]]:
    """Per stage: median and p90 in microseconds over the calls that stamped both of its edges."""
    rows = []
    for start, end, what in STAGES:
        spans = [(c[end] - c[start]) / 1000 for c in calls if start in c and end in c]
        if spans:
            q = statistics.quantiles(spans, n=10, method="inclusive") if len(spans) > 1 else [spans[0]] * 9
            rows.append({"stage": what, "from": start, "to": end, "calls": len(spans),
                         "p50_us": statistics.median(spans), "p90_us": q[8]})  # fmt: skip
    return rows


def serve_proxy(upstream: str, admin_key: str, stream_upstream: bool, profile: str = "") -> None:
    from workbench.capture import CaptureProxy

    calls = _install_profile() if profile else []
    proxy = CaptureProxy(upstream, "tiny", admin_key=admin_key, stream_upstream=stream_upstream).start()
    proxy.freeze_startup_objects()  # as `workbench proxy` does: this process hosts the proxy alone
    print(proxy.port, flush=True)
    try:
        sys.stdin.read()  # until the benchmark closes our stdin
    finally:
        proxy.stop()
        if profile:
            Path(profile).write_text(json.dumps(calls))


# -- the load generator -----------------------------------------------------------------------------


class Child:
    """A server process of this script; its first stdout line is its port. Stopped on close()."""

    def __init__(self, *args: str, root: Path = ROOT) -> None:
        """`root`: the checkout whose ``workbench`` package the process imports (this one unless --baseline)."""
        self.proc = subprocess.Popen(
            [sys.executable, __file__, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(root)},
            text=True,
        )
        line = self.proc.stdout.readline()
        if not line.strip().isdigit():
            self.close()
            raise RuntimeError(f"{args[0]} did not start")
        self.url = f"http://127.0.0.1:{int(line)}"

    def cpu_s(self) -> float:
        """CPU time of every thread so far (ns precision, unlike /proc/PID/stat's ticks)."""
        total = 0
        for tid in os.listdir(f"/proc/{self.proc.pid}/task"):
            with open(f"/proc/{self.proc.pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        return total / 1e9

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # the proxy stops itself; the engine is terminated
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                self.proc.wait(10)


async def _block(
    url: str, keys: list[list[str]], body: bytes, calls_per_stream: int, stagger_s: float
) -> dict[str, Any]:
    """`len(keys)` concurrent streams, `calls_per_stream` calls each, back to back; stream j starts after
    j * `stagger_s`, so that the streams do not run in lockstep (the scripted engine's calls all last
    the same, so streams started together would hit the proxy in bursts of c for ever after)."""
    import aiohttp

    latencies: list[float] = []
    ttfc: list[float] = []
    calls: list[tuple[int, int]] = []  # (sent, [DONE] read) per call, ns on the monotonic clock every process shares
    errors = 0

    async def stream(session: aiohttp.ClientSession, stream_keys: list[str], delay: float) -> None:
        nonlocal errors
        await asyncio.sleep(delay)
        for i in range(calls_per_stream):
            headers = {"Authorization": f"Bearer {stream_keys[i // SESSION_CALLS]}", "Content-Type": "application/json"}
            t0, t0_ns = time.perf_counter(), time.perf_counter_ns()
            first = None
            done = False
            async with session.post(url, data=body, headers=headers) as r:
                async for line in r.content:
                    if line.startswith(b"data:"):
                        first = first or time.perf_counter()
                        done = done or line.startswith(b"data: [DONE]")
            if r.status != 200 or not done:
                errors += 1
                continue
            latencies.append(time.perf_counter() - t0)
            ttfc.append(first - t0)
            calls.append((t0_ns, time.perf_counter_ns()))

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
        start = time.perf_counter()
        await asyncio.gather(*(stream(session, k, j * stagger_s) for j, k in enumerate(keys)))
        wall = time.perf_counter() - start
    return {"latencies": latencies, "ttfc": ttfc, "wall_s": wall, "errors": errors, "calls": calls}


def _timed_block(
    server: Child, client: Any, body: bytes, streams: int, calls_per_stream: int, call_s: float
) -> dict[str, Any]:
    """One block against `server` (the engine itself when `client` is None, else a proxy whose control plane
    `client` mints the session keys), with the server's CPU time over the block."""
    keys = (
        [["-"] * calls_per_stream for _ in range(streams)]
        if client is None
        else [
            [
                client.open_session(harness="opencode", temperature=1.0)
                for _ in range((calls_per_stream + SESSION_CALLS - 1) // SESSION_CALLS)
            ]
            for _ in range(streams)
        ]
    )
    cpu0 = server.cpu_s()
    result = asyncio.run(_block(server.url + "/v1/chat/completions", keys, body, calls_per_stream, call_s / streams))
    result["server_cpu_s"] = server.cpu_s() - cpu0
    if client is not None:
        for key in (k for stream_keys in keys for k in stream_keys):
            client.close_session(key)
    return result


def _checkout(root: Path) -> dict[str, Any]:
    """Which code a proxy ran: the checkout, its commit, and whether its capture code had uncommitted changes."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
        return done.stdout.rstrip() if done.returncode == 0 else ""

    changed = git("status", "--porcelain", "--", "workbench/capture")
    return {"root": str(root), "commit": git("rev-parse", "HEAD").strip(), "capture_changed": changed.splitlines()}


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1] if len(values) > 1 else values[0]


def run(args: argparse.Namespace) -> dict[str, Any]:
    from workbench.capture import ProxyClient

    paths = tuple(args.paths) + ((BASELINE,) if args.baseline else ())
    body = _request_body()
    call_s = (args.ttft_ms + (args.tokens - 1) * args.itl_ms) / 1000  # one call's length at the engine
    engine_stamps = Path(tempfile.mkstemp(prefix="wb-engine-profile-", suffix=".json")[1]) if args.profile else None
    engine = Child(
        "--serve-engine",
        str(args.tokens),
        str(args.ttft_ms / 1000),
        str(args.itl_ms / 1000),
        *([str(engine_stamps)] if engine_stamps else []),
    )
    admin = secrets.token_urlsafe(16)
    levels: list[dict[str, Any]] = []
    try:
        for c, calls in zip(args.concurrency, args.calls):
            per_stream = max(1, calls // c // args.rounds)
            proxies = {}
            if "openenv" in paths:
                proxies["openenv"] = Child("--serve-proxy", engine.url, admin, "0")
            stamps = Path(tempfile.mkstemp(prefix="wb-proxy-profile-", suffix=".json")[1]) if args.profile else None
            if "streamed" in paths:
                proxies["streamed"] = Child("--serve-proxy", engine.url, admin, "1", *([str(stamps)] if stamps else []))
            if BASELINE in paths:
                proxies[BASELINE] = Child("--serve-proxy", engine.url, admin, "1", root=args.baseline)
            clients = {name: ProxyClient(p.url, admin) for name, p in proxies.items()}
            servers = {"direct": engine, **proxies}
            blocks: dict[str, list[dict[str, Any]]] = {p: [] for p in paths}
            try:
                for path in paths:  # warm-up: connections, first-call imports
                    _timed_block(servers[path], clients.get(path), body, c, 2, call_s)
                for r in range(args.rounds):
                    k = r % len(paths)
                    order = paths[k:] + paths[:k]
                    for path in order:
                        blocks[path].append(_timed_block(servers[path], clients.get(path), body, c, per_stream, call_s))
                        print(
                            f"  c={c} round {r + 1}/{args.rounds} {path:<8} "
                            f"{len(blocks[path][-1]['latencies'])} calls in {blocks[path][-1]['wall_s']:.1f} s",
                            flush=True,
                        )
            finally:
                for client in clients.values():
                    client.close()
                for p in proxies.values():
                    p.close()
            level = {"concurrency": c, "blocks": blocks, "paths": _summarise(blocks)}
            if stamps is not None:
                level["proxy_stamps"] = json.loads(stamps.read_text() or "[]")
                level["profile"] = profile_summary(level["proxy_stamps"])
                stamps.unlink()
            levels.append(level)
    finally:
        engine.close()
    if engine_stamps is not None:
        arrivals = json.loads(engine_stamps.read_text() or "[]")
        engine_stamps.unlink()
        for level in levels:
            if level["concurrency"] == 1:  # one call at a time: each call is matched to the engine's request inside it
                level["timeline"] = timeline(level["blocks"], arrivals, level.get("proxy_stamps", []))
    return {"levels": levels}


def timeline(
    blocks: dict[str, list[dict[str, Any]]], engine: list[list[int]], proxy: list[dict[str, int]]
) -> dict[str, Any]:
    """Per path, the two hops around the engine, from stamps on the clock all processes share (CLOCK_MONOTONIC):
    request hop = the engine has the request - the client sent it; response hop = the client read [DONE] - the
    engine wrote its last chunk. Proxied minus direct, hop by hop, is where the added latency lies. With the
    streamed proxy's stamps, its request hop is cut in three: client -> the proxy's app called (uvicorn has the
    head), the proxy's own stages to the request written upstream, and that write -> the engine has the request."""

    def inside(starts: list[int], sent: int, done: int) -> int | None:
        i = bisect.bisect_right(starts, sent)
        return i if i < len(starts) and starts[i] < done else None

    engine = sorted(engine)
    engine_starts = [a for a, _, *_ in engine]
    proxied = sorted((c for c in proxy if "in" in c and "sent" in c), key=lambda c: c["in"])
    proxy_starts = [c["in"] for c in proxied]
    out: dict[str, Any] = {}
    for path, bs in blocks.items():
        spans: dict[str, list[float]] = {"request_hop": [], "response_hop": []}
        for sent, done in (c for b in bs for c in b["calls"]):
            i = inside(engine_starts, sent, done)
            if i is None:
                continue
            spans["request_hop"].append((engine[i][0] - sent) / 1000)
            spans["response_hop"].append((done - engine[i][1]) / 1000)
            j = inside(proxy_starts, sent, done) if path == "streamed" else None
            if j is not None:
                p = proxied[j]
                for name, us in (
                    ("client_to_app", p["in"] - sent),
                    ("app_to_written", p["sent"] - p["in"]),
                    ("written_to_engine", engine[i][0] - p["sent"]),
                ):
                    spans.setdefault(name, []).append(us / 1000)
        if spans["request_hop"]:
            out[path] = {"calls": len(spans["request_hop"])}
            out[path].update({f"{name}_us_p50": statistics.median(v) for name, v in spans.items()})
    return out


def _summarise(blocks: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path, bs in blocks.items():
        lat = [x for b in bs for x in b["latencies"]]
        ttfc = [x for b in bs for x in b["ttfc"]]
        calls = len(lat)
        out[path] = {
            "calls": calls,
            "errors": sum(b["errors"] for b in bs),
            "latency_ms": {"p50": 1000 * _pct(lat, 0.5), "p99": 1000 * _pct(lat, 0.99)},
            "ttfc_ms": {"p50": 1000 * _pct(ttfc, 0.5), "p99": 1000 * _pct(ttfc, 0.99)},
            "calls_per_s": calls / sum(b["wall_s"] for b in bs),
            "server_cpu_ms_per_call": 1000 * sum(b["server_cpu_s"] for b in bs) / calls,
        }
    direct = out["direct"]
    for path in (p for p in out if p != "direct"):
        o = out[path]
        o["added_ms"] = {q: o["latency_ms"][q] - direct["latency_ms"][q] for q in ("p50", "p99")}
        o["added_ttfc_ms"] = {q: o["ttfc_ms"][q] - direct["ttfc_ms"][q] for q in ("p50", "p99")}
        o["throughput_ratio"] = o["calls_per_s"] / direct["calls_per_s"]
    return out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-engine":
        return serve_engine(int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), *sys.argv[5:6])
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-proxy":
        return serve_proxy(sys.argv[2], sys.argv[3], sys.argv[4] == "1", *sys.argv[5:6])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument(
        "--calls",
        type=int,
        nargs="+",
        default=[120, 480, 1280],
        help="calls per path at each concurrency (split over --rounds blocks)",
    )
    parser.add_argument("--rounds", type=int, default=4, help="interleaved blocks per path")
    parser.add_argument("--tokens", type=int, default=32, help="sampled tokens per call")
    parser.add_argument("--ttft-ms", type=float, default=50.0, help="the engine's time to first token")
    parser.add_argument("--itl-ms", type=float, default=20.0, help="the engine's time per further token")
    parser.add_argument(
        "--paths", nargs="+", choices=PATHS, default=list(PATHS), help="the paths to measure (direct always is)"
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help=f"a checkout (e.g. a git worktree of the commit before a change) whose streamed proxy runs as "
        f"'{BASELINE}' beside this one's, in the same run",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="stamp the stages of each call inside the streamed proxy and report where its time goes",
    )
    args = parser.parse_args()
    if len(args.calls) != len(args.concurrency):
        parser.error("--calls needs one number per --concurrency")
    args.paths = ["direct", *(p for p in PATHS[1:] if p in args.paths)]
    if args.baseline is not None:
        args.baseline = args.baseline.resolve()
        if not (args.baseline / "workbench" / "capture" / "proxy.py").is_file():
            parser.error(f"--baseline {args.baseline}: not a checkout of this project (no workbench/capture/proxy.py)")

    started = dt.datetime.now(dt.timezone.utc)
    load0 = os.getloadavg()[0]
    result = run(args)
    machine = {
        "cpus": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_avg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
    }
    record = {
        "benchmark": "proxy_overhead",
        "date": started.isoformat(timespec="seconds"),
        "command": " ".join(["python", "benchmarks/proxy_overhead.py", *sys.argv[1:]]),
        "machine": machine,
        "host": host(),
        "config": {
            "tokens": args.tokens,
            "ttft_ms": args.ttft_ms,
            "itl_ms": args.itl_ms,
            "rounds": args.rounds,
            "request_bytes": len(_request_body()),
            "session_calls": SESSION_CALLS,
            "profile": args.profile,
        },
        "code": {"checkout": _checkout(ROOT), "baseline": _checkout(args.baseline) if args.baseline else None},
        **result,
    }
    out = new_run_file("proxy_overhead")
    out.write_text(json.dumps(record, indent=1) + "\n")

    print(
        f"\n{'c':>3} {'path':<13} {'calls':>5} {'p50 ms':>8} {'p99 ms':>8} {'+p50':>7} {'+p99':>7} "
        f"{'TTFC p50':>9} {'TTFC p99':>9} {'calls/s':>8} {'ratio':>6} {'CPU ms/call':>11}"
    )
    for level in result["levels"]:
        for path, s in level["paths"].items():
            added = s.get("added_ms", {})
            print(
                f"{level['concurrency']:>3} {path:<13} {s['calls']:>5} {s['latency_ms']['p50']:>8.1f} "
                f"{s['latency_ms']['p99']:>8.1f} {added.get('p50', 0):>+7.1f} {added.get('p99', 0):>+7.1f} "
                f"{s['ttfc_ms']['p50']:>9.1f} {s['ttfc_ms']['p99']:>9.1f} {s['calls_per_s']:>8.1f} "
                f"{s.get('throughput_ratio', 1.0):>6.3f} {s['server_cpu_ms_per_call']:>11.2f}"
            )
    for level in result["levels"]:
        for path, hops in level.get("timeline", {}).items():
            print(f"  c=1 {path:<13} request hop (client sent -> engine has it) p50 {hops['request_hop_us_p50']:>6.0f} us; "
                  f"response hop (engine's last write -> client read [DONE]) p50 {hops['response_hop_us_p50']:>6.0f} us")  # fmt: skip
            if "client_to_app_us_p50" in hops:
                print(f"      request hop in three: client -> proxy app {hops['client_to_app_us_p50']:.0f} us, "
                      f"proxy app -> written upstream {hops['app_to_written_us_p50']:.0f} us, "
                      f"written -> engine has it {hops['written_to_engine_us_p50']:.0f} us")  # fmt: skip
        for row in level.get("profile", []):
            print(
                f"  c={level['concurrency']} {row['stage']:<72} p50 {row['p50_us']:>7.0f} us  p90 {row['p90_us']:>7.0f} us"
            )
    print(
        f"(CPU ms/call: the engine's for direct, the proxy's otherwise.) load average {machine['load_avg_1m']} "
        f"on {machine['cpus']} CPUs; wrote {out}"
    )


if __name__ == "__main__":
    from workbench.procs import unwind_on_signals

    unwind_on_signals()  # Ctrl-C / SIGTERM stop what the run started, even from nohup
    main()
