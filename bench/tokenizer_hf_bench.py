#!/usr/bin/env python3
"""HF tokenizers' encode and decode throughput on the committed tokenizer corpus, single-threaded,
to quote beside bench/tokenizer_bench.cpp (same corpus, same tokenizers, warm caches, CPU time
of this process like Google Benchmark's default, so that other load on the machine does not count).

    RAYON_NUM_THREADS=1 python bench/tokenizer_hf_bench.py [--repeats 5]

Reports MB/s of corpus text encoded (UTF-8 bytes) for a per-string encode loop and for
encode_batch on one thread, and MB/s of text produced by decode_batch.
"""
import argparse
import json
import os
import pathlib
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
from tokenizers import Tokenizer  # noqa: E402  (after the thread settings)

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOKENIZERS = {
    "qwen3": ROOT.parent / "shared" / "fixtures" / "qwen3" / "tokenizer.json",
    "smollm2": ROOT.parent / "shared" / "fixtures" / "smollm2" / "tokenizer.json",
    "nemotron_tiny": ROOT / "tests" / "fixtures" / "nemotron-tiny" / "tokenizer.json",
}


def best_of(repeats, fn):
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return min(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    corpus = [json.loads(line) for line in
              (ROOT / "tests" / "data" / "tokenizer_corpus.jsonl").read_text("ascii").splitlines()]
    megabytes = sum(len(text.encode("utf-8")) for text in corpus) / 1e6
    print(f"corpus: {len(corpus)} strings, {megabytes:.3f} MB; RAYON_NUM_THREADS="
          f"{os.environ['RAYON_NUM_THREADS']}")
    for name, path in TOKENIZERS.items():
        tokenizer = Tokenizer.from_file(str(path))
        tokenizer.encode_batch(corpus, add_special_tokens=False)  # warm the BPE cache
        loop = best_of(args.repeats, lambda: [tokenizer.encode(t, add_special_tokens=False)
                                              for t in corpus])
        batch = best_of(args.repeats, lambda: tokenizer.encode_batch(corpus,
                                                                     add_special_tokens=False))
        ids = [e.ids for e in tokenizer.encode_batch(corpus, add_special_tokens=False)]
        decoded_mb = sum(len(t.encode("utf-8")) for t in tokenizer.decode_batch(
            ids, skip_special_tokens=False)) / 1e6
        decode = best_of(args.repeats, lambda: tokenizer.decode_batch(
            ids, skip_special_tokens=False))
        print(f"{name:14s} encode loop {megabytes / loop:7.2f} MB/s   encode_batch "
              f"{megabytes / batch:7.2f} MB/s   decode_batch {decoded_mb / decode:7.2f} MB/s")


if __name__ == "__main__":
    main()
