#!/usr/bin/env python3
"""A trained full-vocabulary DSpark head narrowed to a draft vocabulary (docs/training.md,
"The draft vocabulary"; docs/speculative.md §11.1 `draft_vocab_size` + `d2t`).

    reduce_vocab.py HEAD_DIR DATA OUT_DIR --size N [--json STATS]

The head drafts only the N target tokens that carry the most of the target's next-token
probability over the training answers: DATA is a directory of make_dataset.py's shards (the
train split: the held-out split must stay unseen) or the vocab-mass.npz that distill.py train
accumulated over the sequences it drew. Each token's mass is the sum, over every answer position, of
the target's top-k probability for it: the expected count of that token at T = 1, which also
ranks the greedy argmax chain's tokens. Ties break on the lower id, so the subset depends only
on the data.

The narrowed head has:
  - its own `lm_head.weight` [N, H]: those rows of the target's tied lm_head, dequantized from
    the target's MLX checkpoint (the head was trained against exactly these rows, so over the
    subset its logits are the full head's);
  - `markov_head.markov_w2.weight` cut to the same rows (`markov_w1` stays target-indexed: it
    embeds the previous, committed, token);
  - `d2t` (int64 offsets, target id = draft id + d2t[draft id]) and `draft_vocab_size` N.
The draft ids keep the target's order. Nothing else changes, so a draft that lies in the subset
is the one the full head drafts, and the head's product over the vocabulary costs N/V of
before. Speculative decoding stays lossless whatever the subset: the drafter only proposes.
"""
import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

import dspark_head

MODEL = Path.home() / ".cache/dspark/models/SmolLM2-135M-Instruct"


def token_mass(sequences, vocab):
    mass = np.zeros(vocab, dtype=np.float64)
    answers = np.zeros(vocab, dtype=np.int64)
    for sequence in sequences:
        # Row i's distribution is over the token after position i; answer tokens start at
        # prompt_tokens, so rows prompt_tokens - 1 .. n - 2 predict them.
        first, last = sequence.prompt_tokens - 1, len(sequence.tokens) - 1
        np.add.at(mass, sequence.top_ids[first:last].ravel(),
                  sequence.top_probs[first:last].ravel().astype(np.float64))
        np.add.at(answers, sequence.tokens[sequence.prompt_tokens:], 1)
    return mass, answers


def choose(mass, size):
    """The size target ids of the most mass (ties to the lower id), sorted."""
    order = np.lexsort((np.arange(len(mass)), -mass))
    return np.sort(order[:size])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("head_dir", type=Path)
    parser.add_argument("data", type=Path,
                        help="make_dataset.py shards of the train split, or distill.py's "
                             "vocab-mass.npz")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--size", type=int, required=True, help="draft vocabulary size N")
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--json", type=Path, help="write the subset's coverage figures here")
    args = parser.parse_args()

    config = json.loads((args.head_dir / "config.json").read_text())
    vocab = config["vocab_size"]
    if config.get("draft_vocab_size", vocab) != vocab:
        parser.error(f"{args.head_dir} already has a reduced vocabulary")
    if not 0 < args.size < vocab:
        parser.error(f"--size must be in 1..{vocab - 1}")
    if args.data.suffix == ".npz":
        saved = np.load(args.data)
        mass, answers, sequences = saved["mass"], saved["answers"], int(saved["sequences"])
    else:
        shards = dspark_head.read_shards(args.data)
        if not shards:
            parser.error(f"{args.data} holds no shard-*.json")
        (mass, answers), sequences = token_mass(shards, vocab), len(shards)
    chosen = choose(mass, args.size)
    stats = {
        "size": args.size,
        "vocab": vocab,
        "sequences": sequences,
        "answer_tokens": int(answers.sum()),
        "answer_tokens_covered": float(answers[chosen].sum() / answers.sum()),
        "probability_mass_covered": float(mass[chosen].sum() / mass.sum()),
    }

    target = dspark_head.Target(args.model)
    tensors = load_file(str(args.head_dir / "model.safetensors"))
    if "lm_head.weight" in tensors:
        parser.error(f"{args.head_dir} has its own lm_head; this script narrows the target's")
    index = torch.from_numpy(chosen)
    dtype = tensors["markov_head.markov_w2.weight"].dtype
    tensors["lm_head.weight"] = target.embedding()[index].to(dtype).contiguous()
    tensors["markov_head.markov_w2.weight"] = \
        tensors["markov_head.markov_w2.weight"][index].contiguous()
    tensors["d2t"] = torch.from_numpy(chosen - np.arange(args.size)).to(torch.int64)
    config["draft_vocab_size"] = args.size

    args.out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(args.out_dir / "model.safetensors"), metadata={"format": "mlx"})
    (args.out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if (args.head_dir / "training.json").exists() and args.head_dir != args.out_dir:
        shutil.copy(args.head_dir / "training.json", args.out_dir / "training.json")
    print(json.dumps(stats, indent=2))
    if args.json:
        args.json.write_text(json.dumps(stats, indent=2) + "\n")


if __name__ == "__main__":
    main()
