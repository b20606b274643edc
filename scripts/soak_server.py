"""Soak test of `dspark serve` on loopback: mixed traffic from concurrent clients for a fixed time,
then a SIGTERM while requests are still in flight.

    ~/.cache/dspark/venv/bin/python scripts/soak_server.py --minutes 20

Traffic: OpenAI chat (stream and not), completions, Responses, Anthropic messages (stream and
not), streams the client cuts mid-way, and hostile requests (invalid UTF-8, deep nesting, wrong
types, bodies past the size cap, no Content-Length, bad JSON, numbers past a double, oversized
nested fields). Every request must end in a complete answer (a finish_reason / stop_reason /
status that fits its dialect) or an explicit error (an error status in the dialect's error shape,
or an error event in a stream); anything else is lost. A probe measures the latency of a small
well-formed request while the rest runs; the server's RSS is read at the start (after a warm-up
that visits every request class) and at the end.

Exits non-zero when a request was lost, RSS grew more than 5 %, the server died, or it did not
exit within its shutdown grace + 1 s of the SIGTERM.
"""
import argparse
import collections
import http.client
import json
import os
import pathlib
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_MODEL = pathlib.Path.home() / ".cache/dspark/models/SmolLM2-135M-Instruct"
OPENAI_FINISH = {"stop", "length", "tool_calls"}
ANTHROPIC_STOP = {"end_turn", "max_tokens", "stop_sequence", "tool_use"}
PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.",
           "List three prime numbers.", "Explain recursion in one sentence.",
           "Translate 'good morning' into Spanish.", "Name a colour of the rainbow."]
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 20}},
          "required": ["answer"]}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Outcome(Exception):
    """How one request ended: kind is "complete", "error" or "lost"; label says more."""

    def __init__(self, kind, label):
        super().__init__(f"{kind}: {label}")
        self.kind, self.label = kind, label


# --- well-formed requests ---------------------------------------------------------------------------

def chat_body(rng, stream):
    body = {"messages": [{"role": "user", "content": rng.choice(PROMPTS)}],
            "max_tokens": rng.randint(4, 24), "temperature": rng.choice([0, 0.7, 1.0]),
            "stream": stream}
    if rng.random() < 0.2:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "a", "schema": SCHEMA}}
    if stream and rng.random() < 0.5:
        body["stream_options"] = {"include_usage": True}
    return body


WELL_FORMED = {
    # class: (route, dialect, body maker, stream)
    "chat": ("/v1/chat/completions", "openai", lambda r: chat_body(r, False), False),
    "chat_stream": ("/v1/chat/completions", "openai", lambda r: chat_body(r, True), True),
    "completion": ("/v1/completions", "openai", lambda r: {
        "prompt": r.choice(PROMPTS), "max_tokens": r.randint(4, 24), "temperature": 0.5}, False),
    "completion_stream": ("/v1/completions", "openai", lambda r: {
        "prompt": r.choice(PROMPTS), "max_tokens": r.randint(4, 24), "stream": True}, True),
    "responses": ("/v1/responses", "responses", lambda r: {
        "input": r.choice(PROMPTS), "max_output_tokens": r.randint(4, 24)}, False),
    "responses_stream": ("/v1/responses", "responses", lambda r: {
        "input": r.choice(PROMPTS), "max_output_tokens": r.randint(4, 24), "stream": True}, True),
    "messages": ("/v1/messages", "anthropic", lambda r: {
        "max_tokens": r.randint(4, 24), "system": "Be brief.",
        "messages": [{"role": "user", "content": r.choice(PROMPTS)}]}, False),
    "messages_stream": ("/v1/messages", "anthropic", lambda r: {
        "max_tokens": r.randint(4, 24), "stream": True,
        "messages": [{"role": "user", "content": r.choice(PROMPTS)}]}, True),
}


def check_error_shape(dialect, status, data):
    try:
        body = json.loads(data)
    except ValueError:
        raise Outcome("lost", f"HTTP {status} without a JSON error body")
    if dialect == "anthropic":
        ok = body.get("type") == "error" and isinstance(body.get("error", {}).get("message"), str)
    else:
        ok = isinstance(body.get("error"), dict) and isinstance(body["error"].get("message"), str)
    if not ok:
        raise Outcome("lost", f"HTTP {status} error body not in the {dialect} shape")
    raise Outcome("error", str(status))


def check_complete(dialect, route, body):
    if dialect == "anthropic":
        ok = body.get("stop_reason") in ANTHROPIC_STOP and body.get("type") == "message"
    elif dialect == "responses":
        ok = body.get("status") in ("completed", "incomplete")
        if body.get("status") == "incomplete":
            ok = ok and body.get("incomplete_details", {}).get("reason") == "max_output_tokens"
    else:
        ok = body.get("choices") and body["choices"][0].get("finish_reason") in OPENAI_FINISH
    if not ok:
        raise Outcome("lost", f"200 without a consistent ending on {route}")
    raise Outcome("complete", "")


def sse_lines(resp):
    """The data / event lines of a streamed response, until the server closes it."""
    while True:
        line = resp.fp.readline()
        if not line:
            return
        line = line.decode("utf-8", "replace").rstrip("\r\n")
        if line.startswith(("data: ", "event: ")):
            yield line


def check_stream(dialect, resp, cut_after=None):
    """Raises the outcome of a stream; with cut_after, the client leaves after that many lines."""
    finished = False
    for count, line in enumerate(sse_lines(resp)):
        if cut_after is not None and count >= cut_after:
            raise Outcome("complete", "cut by the client")
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            if finished:
                raise Outcome("complete", "")
            raise Outcome("lost", "[DONE] without a finish_reason")
        frame = json.loads(data)
        kind = frame.get("type")
        if "error" in frame and (dialect != "anthropic" or kind == "error"):
            raise Outcome("error", "stream error event")
        if dialect == "openai":
            choices = frame.get("choices") or [{}]
            reason = choices[0].get("finish_reason")
            if reason == "error":
                continue  # the error object follows
            if reason is not None:
                if reason not in OPENAI_FINISH:
                    raise Outcome("lost", f"finish_reason {reason!r}")
                finished = True
        elif dialect == "anthropic":
            if kind == "message_delta":
                finished = frame["delta"].get("stop_reason") in ANTHROPIC_STOP
            elif kind == "message_stop":
                if finished:
                    raise Outcome("complete", "")
                raise Outcome("lost", "message_stop without a stop_reason")
        else:
            if kind in ("response.completed", "response.incomplete"):
                raise Outcome("complete", "")
            if kind in ("response.failed", "error"):
                raise Outcome("error", "stream error event")
    if cut_after is not None:
        raise Outcome("complete", "ended before the client cut it")
    raise Outcome("lost", "the stream ended without an ending or an error")


def send(port, route, body, dialect, stream, cut_after=None, timeout=180):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn.request("POST", route, body=data,
                     headers={"Content-Type": "application/json", "Connection": "close"})
        resp = conn.getresponse()
        if resp.status != 200:
            check_error_shape(dialect, resp.status, resp.read())
        if stream:
            check_stream(dialect, resp, cut_after)
        check_complete(dialect, route, json.loads(resp.read()))
    except ConnectionRefusedError:
        raise Outcome("unreachable", "connection refused")
    except (ConnectionResetError, BrokenPipeError) as e:
        raise Outcome("lost", f"connection reset ({type(e).__name__})")
    except (socket.timeout, TimeoutError):
        raise Outcome("lost", "client timeout")
    except (http.client.HTTPException, ValueError, KeyError, OSError) as e:
        raise Outcome("lost", f"{type(e).__name__}: {e}")
    finally:
        conn.close()


# --- hostile requests -------------------------------------------------------------------------------

def raw_exchange(port, data, timeout=30):
    """Sends raw bytes and reads until the server closes; (status, body bytes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        reply = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    parts = head.split(b" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise Outcome("lost", "no HTTP status line")
    return int(parts[1]), body


def deep(depth):
    return '{"a":' * depth + "1" + "}" * depth


HOSTILE = {
    "invalid_utf8": lambda r: ("/v1/chat/completions", "openai", json.dumps(
        {"messages": [{"role": "user", "content": "MARK"}]}).encode().replace(b"MARK", b"caf\xe9\xff")),
    "deep_nesting": lambda r: ("/v1/messages", "anthropic", (
        '{"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "metadata": '
        + deep(r.choice([200, 5000, 100000])) + "}").encode()),
    "wrong_types": lambda r: ("/v1/chat/completions", "openai", json.dumps(r.choice([
        {"messages": "hi"}, {"messages": [{"role": 7, "content": "hi"}]},
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": "ten"},
        {"messages": [{"role": "user", "content": "hi"}], "temperature": [1]},
        {"messages": [{"role": "user", "content": "hi"}], "tools": {"a": 1}}])).encode()),
    "wrong_types_responses": lambda r: ("/v1/responses", "responses", json.dumps(r.choice([
        {"input": 5}, {"input": [{"type": "message", "role": "robot", "content": "x"}]},
        {"input": "hi", "max_output_tokens": -3}])).encode()),
    "bad_json": lambda r: ("/v1/messages", "anthropic", r.choice([
        b'{"max_tokens": 4, "messages": [', b"{'single': 'quotes'}", b"", b"nul\x00l",
        b'{"messages": [{"role": "user", "content": "hi"}]} trailing'])),
    "number_overflow": lambda r: ("/v1/chat/completions", "openai",
                                  b'{"messages": [{"role": "user", "content": "hi"}], '
                                  b'"max_tokens": 1e999}'),
    "oversized_field": lambda r: ("/v1/chat/completions", "openai", json.dumps({
        "messages": [{"role": "user", "content": "hi"}],
        "chat_template_kwargs": {"x": "y" * (1 << 17)}}).encode()),
    "huge_body": lambda r: ("/v1/chat/completions", "openai", json.dumps({
        "messages": [{"role": "user", "content": "z" * (9 << 20)}]}).encode()),
}


def hostile(port, rng, name):
    if name == "missing_content_length":
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
        status, data = raw_exchange(port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                                          b"Content-Type: application/json\r\n"
                                          b"Connection: close\r\n\r\n" + body)
        if status != 411:
            raise Outcome("lost", f"no Content-Length answered {status}")
        check_error_shape("openai", status, data)
    route, dialect, body = HOSTILE[name](rng)
    try:
        send(port, route, body, dialect, stream=False)
    except Outcome as outcome:
        if outcome.kind == "complete":
            raise Outcome("lost", f"hostile request {name} was answered 200")
        if name == "huge_body" and outcome.label.startswith("connection reset"):
            # The server may answer 413 and close before the body is all sent; the client then
            # cannot read the answer it was given.
            raise Outcome("error", "413 (closed while sending)")
        raise


# --- the run ----------------------------------------------------------------------------------------

def rss_kib(pid):
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def rss_breakdown(pid):
    """Resident KiB by kind of mapping: the mapped model files, the main heap, other anonymous
    memory (malloc arenas of the connection threads, large allocations), stacks."""
    kinds = collections.Counter()
    kind = "anonymous"
    for line in pathlib.Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and len(fields) >= 5:
            name = fields[5] if len(fields) > 5 else ""
            kind = ("files" if name.startswith("/") else "heap" if name == "[heap]"
                    else "stacks" if name.startswith("[stack") else
                    "anonymous" if not name else "other")
        elif fields and fields[0] == "Rss:":
            kinds[kind] += int(fields[1])
    return ", ".join(f"{kind} {kib / 1024:.1f}" for kind, kib in sorted(kinds.items()))


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = collections.Counter()
        self.lost = []

    def add(self, klass, outcome):
        with self.lock:
            if outcome.kind == "lost":
                self.lost.append(f"{klass}: {outcome.label}")
            label = outcome.kind if outcome.kind != "error" else f"error {outcome.label}"
            if outcome.label == "cut by the client":
                label = "cut by client"
            self.counts[(klass, label)] += 1


def run_one(port, rng, tally, klass):
    try:
        if klass.startswith("hostile:"):
            hostile(port, rng, klass[len("hostile:"):])
        elif klass == "disconnect":
            route, dialect, make, _ = WELL_FORMED[rng.choice(
                ["chat_stream", "completion_stream", "responses_stream", "messages_stream"])]
            body = dict(make(rng), max_tokens=64, stream=True)
            if dialect == "responses":
                body = dict(make(rng), max_output_tokens=64, stream=True)
            send(port, route, body, dialect, True, cut_after=rng.randint(1, 6))
        else:
            route, dialect, make, stream = WELL_FORMED[klass]
            send(port, route, make(rng), dialect, stream)
        raise Outcome("lost", "no outcome")
    except Outcome as outcome:
        tally.add(klass, outcome)
        return outcome


def client_loop(port, seed, tallies, stop):
    """Sends requests until `stop`, each counted in the current phase's tally (tallies[-1])."""
    rng = random.Random(seed)
    classes = list(WELL_FORMED) * 3 + ["disconnect"] * 3 + \
        [f"hostile:{name}" for name in list(HOSTILE) + ["missing_content_length"]
         if name != "huge_body"] + ["hostile:huge_body"] * (1 if seed % 3 == 0 else 0)
    while not stop.is_set():
        tally = tallies[-1]
        run_one(port, rng, tally, rng.choice(classes))


def probe_loop(port, latencies, stop):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0}
    while not stop.is_set():
        start = time.monotonic()
        try:
            send(port, "/v1/chat/completions", body, "openai", False, timeout=300)
        except Outcome as outcome:
            if outcome.kind == "complete":
                latencies.append(time.monotonic() - start)
        stop.wait(1.0)


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=20)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--binary", default=str(ROOT / "build" / "dspark"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--grace", type=float, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--warmup-seconds", type=float, default=60)
    parser.add_argument("--server-arg", action="append", default=[],
                        help="one more argument for dspark serve (repeatable)")
    args = parser.parse_args()

    port = free_port()
    log = tempfile.NamedTemporaryFile("w+", prefix="soak-serve-", suffix=".log", delete=False)
    server = subprocess.Popen(
        [args.binary, "serve", "--model", args.model, "--port", str(port), "--threads",
         str(args.threads), "--shutdown-grace", str(args.grace), "--no-log", *args.server_arg],
        stdout=log, stderr=subprocess.STDOUT)
    print(f"soak: dspark serve pid {server.pid} on 127.0.0.1:{port}, log {log.name}", flush=True)
    deadline = time.time() + 120
    while True:
        if server.poll() is not None or time.time() > deadline:
            sys.exit(f"soak: the server did not start (see {log.name})")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                break
        except OSError:
            pass
        time.sleep(0.3)

    # Warm-up: the same mixed traffic, so caches (prefix slots, grammar masks, allocator arenas of
    # the connection threads) are at their working size before the first RSS sample.
    warm, tally, in_flight = Tally(), Tally(), Tally()
    tallies = [warm]
    latencies = []
    stop = threading.Event()
    clients = [threading.Thread(target=client_loop, args=(port, args.seed * 1000 + i, tallies, stop),
                                daemon=True) for i in range(args.clients)]
    probe = threading.Thread(target=probe_loop, args=(port, latencies, stop), daemon=True)
    for thread in clients:
        thread.start()
    time.sleep(args.warmup_seconds)
    rss_start = rss_kib(server.pid)
    breakdown_start = rss_breakdown(server.pid)
    tallies.append(tally)
    probe.start()
    print(f"soak: warm-up done ({sum(warm.counts.values())} requests, lost {len(warm.lost)}), "
          f"RSS {rss_start / 1024:.1f} MiB; running {args.minutes} min with {args.clients} "
          "clients", flush=True)
    end = time.time() + args.minutes * 60
    died = None
    while time.time() < end:
        time.sleep(min(30, max(0.1, end - time.time())))
        if server.poll() is not None:
            died = server.returncode
            break
        done = sum(tally.counts.values())
        print(f"soak: {int(args.minutes * 60 - (end - time.time()))} s, {done} requests, "
              f"lost {len(tally.lost)}, RSS {rss_kib(server.pid) / 1024:.1f} MiB", flush=True)

    rss_end = rss_kib(server.pid) if died is None else 0
    if died is None:
        print(f"soak: RSS by kind (MiB) at the start: {breakdown_start}; at the end: "
              f"{rss_breakdown(server.pid)}", flush=True)
    # Shutdown: the clients start nothing new; what they have in flight, and long streams opened
    # just before, must end honestly (complete, or an error status / event) once SIGTERM lands.
    stop.set()
    tallies.append(in_flight)
    long_streams = []
    for i, klass in enumerate(["chat_stream", "messages_stream", "responses_stream", "chat"]):
        route, dialect, make, stream = WELL_FORMED[klass]
        body = dict(make(random.Random(i)), max_tokens=400, max_output_tokens=400)
        if dialect != "responses":
            body.pop("max_output_tokens")
        else:
            body.pop("max_tokens")

        def long_request(route=route, dialect=dialect, body=body, stream=stream, klass=klass):
            try:
                send(port, route, body, dialect, stream)
            except Outcome as outcome:
                in_flight.add(f"long {klass}", outcome)

        long_streams.append(threading.Thread(target=long_request, daemon=True))
        long_streams[-1].start()
    time.sleep(1.0)
    exit_seconds = None
    if died is None:
        server.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        try:
            server.wait(timeout=args.grace + 30)
            exit_seconds = time.monotonic() - sent
        except subprocess.TimeoutExpired:
            server.kill()
    for thread in clients + [probe] + long_streams:
        thread.join(timeout=200)

    print("\n=== soak report")
    print(f"duration {args.minutes} min, {args.clients} clients + 1 latency probe, "
          f"server threads {args.threads}, shutdown grace {args.grace} s")
    by_kind = collections.Counter()
    for (klass, label), n in sorted(tally.counts.items()):
        print(f"  {klass:32s} {label:36s} {n:6d}")
        by_kind[label.split(" ")[0] if label.startswith("error") else label] += n
    total = sum(tally.counts.values())
    print(f"requests {total}: " + ", ".join(f"{k} {v}" for k, v in sorted(by_kind.items())))
    errors = collections.Counter()
    for (klass, label), n in tally.counts.items():
        if label.startswith("error"):
            errors[label[6:]] += n
    print("errors by status: " + ", ".join(f"{k}: {v}" for k, v in sorted(errors.items())))
    print("in flight at SIGTERM: " + ", ".join(
        f"{klass} {label} {n}" for (klass, label), n in sorted(in_flight.counts.items())))
    lost = warm.lost + tally.lost + in_flight.lost
    print(f"lost {len(lost)} (warm-up {len(warm.lost)}, run {len(tally.lost)}, "
          f"shutdown {len(in_flight.lost)}); warm-up requests {sum(warm.counts.values())}")
    for item in lost[:20]:
        print(f"  lost: {item}")
    growth = (rss_end - rss_start) / rss_start * 100 if rss_end else float("nan")
    print(f"RSS start {rss_start / 1024:.1f} MiB, end {rss_end / 1024:.1f} MiB, "
          f"growth {growth:+.2f} %")
    print(f"probe latency (chat, max_tokens 1) over {len(latencies)} requests: "
          f"p50 {percentile(latencies, 0.5) * 1000:.0f} ms, "
          f"p99 {percentile(latencies, 0.99) * 1000:.0f} ms")
    if exit_seconds is not None:
        print(f"SIGTERM: exited in {exit_seconds:.2f} s with status {server.returncode} "
              f"(allowed {args.grace + 1:.0f} s)")
    failures = []
    if died is not None:
        failures.append(f"the server died with status {died}")
    if exit_seconds is None and died is None:
        failures.append("the server did not exit after SIGTERM")
    elif exit_seconds is not None and exit_seconds > args.grace + 1:
        failures.append(f"exit took {exit_seconds:.2f} s")
    if lost:
        failures.append(f"{len(lost)} requests lost")
    if not growth <= 5:
        failures.append(f"RSS grew {growth:.2f} %")
    print("soak: " + ("FAILED: " + "; ".join(failures) if failures else "passed"))
    log.close()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
