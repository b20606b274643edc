#!/usr/bin/env python3
"""Checks that an exported head computes in dspark what it computed in training
(docs/training.md): dspark_tool_drafter loads HEAD_DIR unquantized (--drafter-bits 0) beside the
default model, feeds it the target's taps of a few prompts and drafts greedily for some rounds;
the PyTorch module of training, loaded from the same files, must draft the same tokens from the
same fed taps, with logits within float32 rounding.

    check_export.py HEAD_DIR DATA_DIR [--contexts 4]

DATA_DIR/heldout's shards give the prompts (their prompt tokens). The tests in
tests/oracle/test_dspark_head.py hold dspark against mlx-dspark on the committed head; this
script closes the other side, training's module against dspark.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dspark_head  # noqa: E402

SOURCE_DIR = Path(__file__).resolve().parents[2]
MODEL = Path.home() / ".cache/dspark/models/SmolLM2-135M-Instruct"


def torch_rounds(head, out):
    """The drafts and logits training's module gives for each of the tool's rounds."""
    config = head.config
    n_taps = len(config["target_layer_ids"])
    fed = torch.tensor(out["fed_taps"], dtype=torch.float32).view(-1, n_taps *
                                                                  config["hidden_size"])
    results = []
    with torch.no_grad():
        for record in out["rounds"]:
            position, pending = record["position"], record["pending"]
            context = head.context(fed[:position])
            hidden = head.backbone(context, torch.tensor([position]), torch.tensor([pending]))
            base = head.base_logits(hidden[0])
            drafts, logits, prev = [], [], pending
            for i in range(dspark_head.BLOCK_SIZE):
                slot = base[i] + head.markov_w2 @ head.markov_w1[prev]
                prev = int(head.to_target(slot.argmax()))
                drafts.append(prev)
                logits.append(slot.numpy())
            results.append((drafts, np.stack(logits)))
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("head_dir", type=Path)
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--contexts", type=int, default=4)
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--tool", default=str(SOURCE_DIR / "build/tests/dspark_tool_drafter"))
    args = parser.parse_args()
    target = dspark_head.Target(args.model)
    head = dspark_head.DSparkHead.load_exported(args.head_dir, target.embedding())
    sequences = dspark_head.read_shards(args.data_dir / "heldout")[: args.contexts]
    env = dict(os.environ, DSPARK_NUMERICS="fp32")
    worst, mismatches = 0.0, 0
    for sequence in sequences:
        with tempfile.TemporaryDirectory() as work:
            script = {"target": str(args.model), "drafter": str(args.head_dir), "kind": "dspark",
                      "bits": 0, "prompt": sequence.tokens[: sequence.prompt_tokens].tolist(),
                      "rounds": 4, "cap": dspark_head.BLOCK_SIZE, "accept": [3, 0, 7, 1]}
            Path(work, "script.json").write_text(json.dumps(script))
            subprocess.run([args.tool, f"{work}/script.json", f"{work}/out.json"], check=True,
                           env=env)
            out = json.loads(Path(work, "out.json").read_text())
        for record, (drafts, logits) in zip(out["rounds"], torch_rounds(head, out)):
            ours = np.array(record["logits"], dtype=np.float32).reshape(logits.shape)
            worst = max(worst, float(np.abs(ours - logits).max() / np.abs(logits).max()))
            if record["drafts"] != drafts:
                mismatches += 1
                print(f"{sequence.id} position {record['position']}: dspark {record['drafts']}, "
                      f"training's module {drafts}")
    print(f"{len(sequences)} contexts x 4 rounds: {mismatches} rounds with other drafts, largest "
          f"logit difference {worst:.2e} of the largest logit")
    return 1 if mismatches or worst > 1e-3 else 0


if __name__ == "__main__":
    sys.exit(main())
