"""Long prompts on a served model: time to first token, prefill progress, the prefix cache on a
second turn, and decode speed at depth.

Starts `dspark serve` on the model, sends one chat turn whose user message is about `--tokens`
tokens of documentation text (greedy, `--max-tokens` answer tokens, end-of-text banned), samples
`/metrics` every few seconds while it prefills, then sends the second turn (the first turn, its
answer and a short new question), which the prefix cache should serve from its checkpoint: only the
new tokens are prefilled. Prints one JSON object per turn (x_dspark figures: cached tokens,
prefill tok/s, TTFT, decode tok/s at depth) and the progress samples.

    bench/long_context.py --model ~/.cache/dspark/synthetic/nano-52L-4bit --tokens 8192 \
        [--threads 2] [--max-tokens 32] [--json out.json]
"""
import argparse
import json
import pathlib
import re
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]


def documentation_text():
    parts = [p.read_text() for p in sorted((ROOT / "docs").rglob("*.md"))]
    return "\n\n".join([(ROOT / "README.md").read_text()] + parts)


def post(port, path, body, timeout):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return json.loads(reply.read())


def get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as reply:
        return reply.read().decode()


def text_of_tokens(port, tokens):
    """Documentation text that the model's tokenizer encodes into about `tokens` tokens."""
    text = documentation_text()
    while len(post(port, "/tokenize", {"content": text}, 600)["tokens"]) < tokens:
        text += "\n\n" + text
    ids = post(port, "/tokenize", {"content": text}, 600)["tokens"][:tokens]
    return post(port, "/detokenize", {"tokens": ids}, 600)["content"]


def gauge(metrics, name):
    match = re.search(rf"^{name} (\S+)$", metrics, re.M)
    return float(match[1]) if match else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--port", type=int, default=8093)
    parser.add_argument("--sample-seconds", type=float, default=10.0)
    parser.add_argument("--json", type=pathlib.Path)
    options = parser.parse_args()

    serve = [str(ROOT / "build/dspark"), "serve", "--model", options.model, "--port",
             str(options.port), "--threads", str(options.threads), "--mode", "baseline",
             "--context-window", str(options.tokens + 4096)]
    server = subprocess.Popen(serve, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 600
        while True:
            try:
                if json.loads(get(options.port, "/health")).get("status") == "ok":
                    break
            except OSError:
                pass
            if server.poll() is not None or time.time() > deadline:
                sys.exit(f"long_context: the server did not start: {server.stderr.read()}")
            time.sleep(1)
        document = text_of_tokens(options.port, options.tokens)
        config = json.loads((pathlib.Path(options.model) / "config.json").read_text())
        eos = config.get("eos_token_id", [])
        ask = {"model": "m", "temperature": 0, "max_tokens": options.max_tokens,
               "logit_bias": {str(e): -100 for e in (eos if isinstance(eos, list) else [eos])}}
        first = [{"role": "user", "content": document + "\n\nSummarise the text above."}]

        samples = []
        done = threading.Event()

        def sample_progress():
            start = time.time()
            while not done.wait(options.sample_seconds):
                metrics = get(options.port, "/metrics")
                samples.append({"seconds": round(time.time() - start, 1),
                                "done": gauge(metrics, "dspark_prefill_tokens_done"),
                                "total": gauge(metrics, "dspark_prefill_tokens_total")})

        sampler = threading.Thread(target=sample_progress)
        sampler.start()
        turns = []
        started = time.time()
        try:
            reply = post(options.port, "/v1/chat/completions", dict(ask, messages=first), 36000)
        finally:
            done.set()
            sampler.join()
        turns.append((reply, time.time() - started))
        second = first + [{"role": "assistant", "content": reply["choices"][0]["message"]["content"]},
                          {"role": "user", "content": "Now list three questions it answers."}]
        started = time.time()
        reply = post(options.port, "/v1/chat/completions", dict(ask, messages=second), 36000)
        turns.append((reply, time.time() - started))
    finally:
        server.terminate()
        server.wait(timeout=60)

    keys = ["cached_tokens", "prefill_tok_s", "ttft_seconds", "decode_tok_s", "completion_tokens"]
    result = {"model": options.model, "threads": options.threads, "turns": [],
              "prefill_progress_samples": samples}
    for reply, seconds in turns:
        stats = reply["x_dspark"]
        result["turns"].append(dict({"prompt_tokens": reply["usage"]["prompt_tokens"],
                                     "wall_seconds": round(seconds, 2)},
                                    **{k: stats.get(k) for k in keys}))
    print(json.dumps(result, indent=2))
    if options.json:
        options.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
