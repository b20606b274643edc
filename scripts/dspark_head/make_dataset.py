#!/usr/bin/env python3
"""Runs the target over the prompt set with dspark_tool_taps, in resumable shards
(docs/training.md).

    make_dataset.py PROMPTS_DIR DATA_DIR [--split train|heldout] [--limit N] [--minutes M]
                    [--worker I/N] [--first-shard K]

Shard k of a split answers prompts [k*B, (k+1)*B) of its list, B = SHARD_PROMPTS of the split
(train.jsonl in order, answers of up to 160 tokens; the held-out suites chat, code, math, every
prompt greedy and the first HELD_OUT_SAMPLED of each suite also at temperature 1 with seed 1, up
to 128 tokens), and is written as DATA_DIR/<split>/shard-k.{json,bin}. A shard that exists is
skipped, so an interrupted run resumes; --minutes stops starting new shards after M minutes,
--limit caps the prompts used, --first-shard skips the shards before K (data a warm start has
seen). --worker I/N takes only the shards k with k % N == I.

The tool answers CONCURRENCY prompts of a shard at once, their decode steps batched into one
forward; the answers are the ones each prompt gets alone. On the 2-core AVX2 VM one
single-thread worker (DSPARK_THREADS=1) made 38 answer tokens/s at concurrency 8 against 28 at
concurrency 1 (about half of the time at 8 is the replay forward over prompt + answer, which
computes every row's logits); two such workers run side by side, about 70 tokens/s together (a
135M-parameter step splits poorly over threads). Every shard's taps are the CANDIDATE_TAPS
layers, from which training picks its subset.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parents[2]
MODEL = Path(os.environ.get("DSPARK_MODELS_DIR", Path.home() / ".cache/dspark/models")) / \
    "SmolLM2-135M-Instruct"
# Spread over the 30 layers; the last layer cannot be a tap (docs/speculative.md §9).
CANDIDATE_TAPS = [1, 5, 9, 13, 17, 21, 25, 28]
TOP_K = 32
MAX_TOKENS = {"train": 160, "heldout": 128}
HELD_OUT_SAMPLED = 8
SHARD_PROMPTS = {"train": 32, "heldout": 8}
CONCURRENCY = 16


def split_prompts(prompts_dir, split):
    if split == "train":
        return [json.loads(line) for line in (prompts_dir / "train.jsonl").read_text().splitlines()]
    prompts = []
    for suite in ("chat", "code", "math"):
        lines = (prompts_dir / "heldout" / f"{suite}.jsonl").read_text().splitlines()
        for i, line in enumerate(lines):
            record = json.loads(line)
            for temperature in (0.0, 1.0) if i < HELD_OUT_SAMPLED else (0.0,):
                prompts.append({"id": f"{record['id']}@T{temperature:g}", "suite": suite,
                                "text": record["prompt"], "temperature": temperature, "seed": 1})
    return prompts


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("prompts_dir", type=Path)
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--split", choices=["train", "heldout"], default="train")
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--minutes", type=float, default=0.0)
    parser.add_argument("--worker", default="0/1")
    parser.add_argument("--first-shard", type=int, default=0,
                        help="skip the shards before this one (data a warm start has seen)")
    parser.add_argument("--tool", default=str(SOURCE_DIR / "build/tests/dspark_tool_taps"))
    parser.add_argument("--model", default=str(MODEL))
    args = parser.parse_args()
    prompts = split_prompts(args.prompts_dir, args.split)
    if args.limit:
        prompts = prompts[:args.limit]
    out = args.data_dir / args.split
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    shard_prompts = SHARD_PROMPTS[args.split]
    shards = (len(prompts) + shard_prompts - 1) // shard_prompts
    worker, workers = (int(x) for x in args.worker.split("/"))
    for k in range(args.first_shard + worker, shards, workers):
        stem = out / f"shard-{k:05d}"
        if (stem.with_suffix(".json")).exists():
            continue
        if args.minutes and time.monotonic() - start > args.minutes * 60:
            print(f"{args.split}: stopped after {args.minutes} minutes at shard {k} of {shards}")
            return 0
        batch = prompts[k * shard_prompts:(k + 1) * shard_prompts]
        script = {"model": args.model, "taps": CANDIDATE_TAPS, "top_k": TOP_K,
                  "max_tokens": MAX_TOKENS[args.split], "concurrency": CONCURRENCY,
                  "prompts": [{key: p[key] for key in ("id", "text", "temperature", "seed")}
                              for p in batch]}
        script_path = out / f"shard-{k:05d}.script.json"
        script_path.write_text(json.dumps(script))
        shard_start = time.monotonic()
        subprocess.run([args.tool, str(script_path), str(stem)], check=True)
        script_path.unlink()
        index = json.loads(stem.with_suffix(".json").read_text())
        tokens = sum(len(s["tokens"]) - s["prompt_tokens"] for s in index["sequences"])
        print(f"{args.split} shard {k + 1}/{shards}: {tokens} answer tokens in "
              f"{time.monotonic() - shard_start:.1f} s", flush=True)
    print(f"{args.split}: all {shards} shards present")
    return 0


if __name__ == "__main__":
    sys.exit(main())
