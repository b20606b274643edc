#!/usr/bin/env python3
"""Acceptance figures of a DSpark head on the held-out split (docs/training.md).

    evaluate.py offline HEAD_DIR DATA_DIR [--json OUT]
    evaluate.py sampled HEAD_DIR PROMPTS_DIR [--json OUT] [--max-tokens 128]

offline (PyTorch, training's module loaded from the exported files, unquantized): every answer
position of every held-out sequence is an anchor; the head drafts a full block there.
  greedy (the sequences decoded at T = 0, where each answer token is the target's argmax): the
    drafts follow the Markov chain on the head's own tokens, a round commits the leading drafts
    equal to the target's tokens plus one, per-slot acceptance is P(slot i right | slots before
    right), and the confidence head's c_i is scored against that event (ECE over 10 bins, AUC).
  T = 1 (the sequences sampled at T = 1): slot i's acceptance probability is sum_v min(p, q) with
    the previous tokens the sequence's (q: the head's distribution, p: the target's top-32 ones),
    a round's expected length 1 + sum_k prod_{i<=k} a_i; the confidence is scored against a_i
    (ECE) and against a Bernoulli(a_i) draw (AUC, seeded).
sampled (dspark itself): `dspark generate --mode dspark` and `--mode lookup` at --temp 1 on
  every held-out prompt with seeds 1..3, the footer's rounds and slot acceptance summed per suite.
  The greedy figures and the speed-ups from dspark itself are `dspark benchmark`'s (see
  docs/training.md).
"""
import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dspark_head  # noqa: E402

SOURCE_DIR = Path(__file__).resolve().parents[2]
MODEL = Path.home() / ".cache/dspark/models/SmolLM2-135M-Instruct"
W = dspark_head.BLOCK_SIZE


def ece(confidence, outcome, bins=10):
    edges = np.linspace(0, 1, bins + 1)
    which = np.clip(np.digitize(confidence, edges) - 1, 0, bins - 1)
    total = 0.0
    for b in range(bins):
        chosen = which == b
        if chosen.any():
            total += chosen.mean() * abs(confidence[chosen].mean() - outcome[chosen].mean())
    return float(total)


def auc(score, label):
    """Probability that a random accepted slot scores above a random rejected one."""
    label = label.astype(bool)
    if label.all() or not label.any():
        return float("nan")
    order = np.argsort(score, kind="stable")
    ranks = np.empty(len(score))
    ranks[order] = np.arange(1, len(score) + 1)
    positives = label.sum()
    return float((ranks[label].sum() - positives * (positives + 1) / 2) /
                 (positives * (len(label) - positives)))


def draft_blocks(head, sequence, layers, anchors, greedy):
    """Per anchor: the greedy chain's drafts, its confidences, and the teacher-forced slot
    distributions (Markov input: the sequence's own previous tokens)."""
    taps = sequence.fused_taps(layers)
    context = head.context(taps[: anchors.max()])
    hidden = head.backbone(context, torch.from_numpy(anchors),
                           torch.from_numpy(sequence.tokens[anchors]))
    base = head.base_logits(hidden)  # [N, W, draft vocabulary]
    if not greedy:
        rows = np.minimum(anchors[:, None] + np.arange(W), len(sequence.tokens) - 1)
        logits, confidence = head.slot_outputs(hidden, torch.from_numpy(sequence.tokens[rows]))
        return head.widen(torch.softmax(logits, -1)), torch.sigmoid(confidence)
    drafts, confidences = [], []
    prev = torch.from_numpy(sequence.tokens[anchors])
    for i in range(W):
        markov = head.markov_w1[prev]
        logits = base[:, i] + markov @ head.markov_w2.T
        features = torch.cat([hidden[:, i], markov], -1)
        confidences.append(torch.sigmoid(features @ head.confidence_w[0] + head.confidence_b))
        prev = head.to_target(logits.argmax(-1))
        drafts.append(prev)
    return torch.stack(drafts, 1), torch.stack(confidences, 1)


def offline(args):
    target = dspark_head.Target(args.model)
    head = dspark_head.DSparkHead.load_exported(args.head_dir, target.embedding())
    layers = head.config["target_layer_ids"]
    sequences = dspark_head.read_shards(args.data_dir / "heldout")
    rng = np.random.default_rng(0)
    stats = {}
    with torch.no_grad():
        for sequence in sequences:
            suite = sequence.id.split("-")[0]
            greedy = sequence.id.endswith("@T0")
            n, start = len(sequence.tokens), sequence.prompt_tokens
            if n - start < 2:
                continue
            s = stats.setdefault((suite, "greedy" if greedy else "T=1"),
                                 {"rounds": 0, "committed": 0.0, "reached": np.zeros(W),
                                  "accepted": np.zeros(W), "conf": [], "outcome": []})
            for chunk in np.array_split(np.arange(start, n - 1), max(1, (n - 1 - start) // 48)):
                rows = chunk[:, None] + np.arange(W)[None, :]
                exists = rows + 1 < n
                labels = sequence.top_ids[np.minimum(rows, n - 1), 0]
                if greedy:
                    drafts, conf = draft_blocks(head, sequence, layers, chunk, True)
                    right = (drafts.numpy() == labels) & exists
                    alive = np.cumprod(np.concatenate([np.ones((len(chunk), 1), bool),
                                                       right[:, :-1]], 1), 1).astype(bool)
                    reached = alive & exists
                    s["committed"] += float((np.cumprod(right, 1).sum(1) + 1).sum())
                    s["reached"] += reached.sum(0)
                    s["accepted"] += (right & reached).sum(0)
                    s["conf"].append(conf.numpy()[reached])
                    s["outcome"].append(right[reached].astype(float))
                else:
                    q, conf = draft_blocks(head, sequence, layers, chunk, False)
                    top_ids = torch.from_numpy(sequence.top_ids[np.minimum(rows, n - 1)]
                                               .astype(np.int64))
                    p = torch.from_numpy(sequence.top_probs[np.minimum(rows, n - 1)])
                    a = torch.minimum(q.gather(-1, top_ids), p).sum(-1).numpy() * exists
                    s["committed"] += float((1 + np.cumprod(a, 1).sum(1)).sum())
                    s["reached"] += exists.sum(0)
                    s["accepted"] += a.sum(0)
                    s["conf"].append(conf.numpy()[exists])
                    s["outcome"].append(a[exists])
                s["rounds"] += len(chunk)
    report = {}
    for (suite, mode), s in sorted(stats.items()):
        conf, outcome = np.concatenate(s["conf"]), np.concatenate(s["outcome"])
        binary = outcome if mode == "greedy" else (rng.random(len(outcome)) < outcome)
        report[f"{suite} {mode}"] = {
            "anchors": s["rounds"], "tokens_per_round": s["committed"] / s["rounds"],
            "slot_acceptance": (s["accepted"] / np.maximum(s["reached"], 1)).round(3).tolist(),
            "confidence_ece": ece(conf, outcome), "confidence_auc": auc(conf, binary)}
    for name, r in report.items():
        print(f"{name:14s} tokens/round {r['tokens_per_round']:.2f}  slots "
              + " ".join(f"{x:.2f}" for x in r["slot_acceptance"])
              + f"  ECE {r['confidence_ece']:.3f} AUC {r['confidence_auc']:.3f}")
    return report


FOOTER_ROUNDS = re.compile(r"Speculative: \w+, cap \S+, (\d+) rounds \+ (\d+) plain steps")
FOOTER_TOKENS = re.compile(r"Generation: (\d+) tokens")
FOOTER_SLOTS = re.compile(r"Acceptance by slot: ([\d. ]+)")


def sampled(args):
    report = {}
    for suite in ("chat", "code", "math"):
        prompts = [json.loads(line)["prompt"] for line in
                   (args.prompts_dir / f"{suite}.jsonl").read_text().splitlines()]
        for mode in ("dspark", "lookup"):
            rounds = tokens = 0
            slots = np.zeros(W)
            for prompt in prompts:
                for seed in (1, 2, 3):
                    command = [str(args.dspark), "generate", "-p", prompt, "--mode", mode,
                               "--temp", "1", "--seed", str(seed), "--max-tokens",
                               str(args.max_tokens), "--threads", "2"]
                    if mode == "dspark":
                        command += ["--drafter", str(args.head_dir), "--max-draft", str(W)]
                    else:
                        command += ["--max-draft", str(W)]
                    out = subprocess.run(command, capture_output=True, text=True, check=True)
                    footer = out.stdout + out.stderr
                    r = FOOTER_ROUNDS.search(footer)
                    n_rounds = int(r.group(1)) + int(r.group(2))
                    rounds += n_rounds
                    tokens += int(FOOTER_TOKENS.search(footer).group(1)) - 1
                    shares = [float(x) for x in FOOTER_SLOTS.search(footer).group(1).split()]
                    slots[: len(shares)] += np.array(shares) * int(r.group(1))
            report[f"{suite} T=1 {mode}"] = {"tokens_per_round": tokens / max(rounds, 1),
                                            "slot_acceptance": (slots / max(rounds, 1))
                                            .round(3).tolist()}
            print(suite, mode, report[f"{suite} T=1 {mode}"], flush=True)
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["offline", "sampled"])
    parser.add_argument("head_dir", type=Path)
    parser.add_argument("data_dir", type=Path, help="DATA_DIR (offline) or PROMPTS_DIR")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--dspark", type=Path, default=SOURCE_DIR / "build/dspark")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.what == "offline":
        report = offline(args)
    else:
        args.prompts_dir = args.data_dir
        report = sampled(args)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
