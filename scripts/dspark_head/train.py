#!/usr/bin/env python3
"""Trains the default model's DSpark head on make_dataset.py's shards (docs/training.md).

    train.py DATA_DIR RUN_DIR [--steps N] [--minutes M] [--taps 9,17,25] [--layers 1]
             [--markov-rank 64] [--draft-vocab 8192] [...]

Resumable: RUN_DIR/checkpoint.pt holds the weights, the optimizer and the step; run the same
command again to go on. --minutes ends this invocation (after a checkpoint) when its time is
spent, so training runs in chunks that other work can interleave with; --steps is the length of
the whole run (the learning-rate schedule's). Every step's data draw is seeded by (seed, step), so
chunk boundaries do not change the result. Each invocation writes RUN_DIR/log.jsonl (appended),
RUN_DIR/loss.png and the exported head RUN_DIR/head/ (config.json + bf16 model.safetensors;
with --draft-vocab N, the head narrowed to its N-token draft vocabulary, trained as it drafts).

Loss per block, after the DSpark paper (Markov-biased slot logits, three terms):
  w_i = exp(-i / gamma) for slot i = 0..6 (near slots matter most: a miss ends the round)
  CE_i  cross-entropy of the slot's Markov-biased logits against the target's greedy token
  L1_i  |softmax(draft) - p_target|_1 over the target's top-32 tokens plus the rest's mass (the
        distribution distillation that T > 0 acceptance, 1 - L1/2, rewards)
  BCE_i the confidence head against the slot's acceptance probability sum_v min(p, q), on
        detached features (it calibrates; it does not steer the drafter)
  loss = sum_i w_i (a_CE CE_i + a_L1 L1_i) / sum_i w_i + mean_i BCE_i
The DSpark paper weighs a_CE = 0.1, a_L1 = 0.9; in our short runs from
scratch the L1 term barely moves a flat draft distribution, so the defaults here are a_CE = 1.0,
a_L1 = 0.9 (--ce-alpha, --l1-alpha).
"""
import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dspark_head  # noqa: E402
import reduce_vocab  # noqa: E402

MODEL = Path.home() / ".cache/dspark/models/SmolLM2-135M-Instruct"
CONFIDENCE_ALPHA = 1.0


def blocks_of(tokens, top_ids, top_probs, taps, anchors):
    """Everything one sequence's blocks need, as tensors on one device: fused taps, anchors and
    per slot the previous token, the target's greedy token, its top-k distribution and whether
    the slot exists. tokens [n], top_ids / top_probs [n, k], taps [n, ...], anchors [N] int64."""
    W = dspark_head.BLOCK_SIZE
    n = tokens.shape[0]
    # The row whose next token slot i predicts.
    rows = anchors[:, None] + torch.arange(W, device=anchors.device)[None, :]
    valid = rows + 1 < n
    rows = rows.clamp(max=n - 1)
    return {"taps": taps[: int(anchors.max())], "anchors": anchors,
            "anchor_tokens": tokens[anchors], "prev": tokens[rows], "label": top_ids[rows, 0],
            "top_ids": top_ids[rows], "top_probs": top_probs[rows], "valid": valid}


def block_batch(sequence, anchors, layers):
    """blocks_of for a shard's sequence (numpy arrays, mapped from the shard)."""
    return blocks_of(torch.from_numpy(sequence.tokens),
                     torch.from_numpy(sequence.top_ids.astype(np.int64)),
                     torch.from_numpy(np.array(sequence.top_probs)),
                     sequence.fused_taps(layers), torch.from_numpy(anchors))


def block_losses(head, batch, gamma, ce_alpha, l1_alpha):
    context = head.context(batch["taps"])
    hidden = head.backbone(context, batch["anchors"], batch["anchor_tokens"])
    logits, confidence = head.slot_outputs(hidden, batch["prev"])
    log_q = F.log_softmax(logits, dim=-1)
    # A narrowed head cannot draft a token outside its vocabulary: such a label takes no
    # cross-entropy, and such a top-k entry has q = 0.
    label = head.from_target(batch["label"])
    top_ids = head.from_target(batch["top_ids"])
    ce = -log_q.gather(-1, label.clamp(min=0)[..., None]).squeeze(-1) * (label >= 0)
    q_top = log_q.gather(-1, top_ids.clamp(min=0)).exp() * (top_ids >= 0)
    p_top = batch["top_probs"]
    l1 = (q_top - p_top).abs().sum(-1) + ((1 - q_top.sum(-1)) - (1 - p_top.sum(-1))).abs()
    accept = torch.minimum(q_top, p_top).sum(-1).detach()
    bce = F.binary_cross_entropy_with_logits(confidence, accept, reduction="none")
    valid = batch["valid"].float()
    slot = torch.arange(dspark_head.BLOCK_SIZE, dtype=torch.float32, device=valid.device)
    slot_weight = torch.exp(-slot / gamma)
    weights = valid * slot_weight
    draft_loss = ((ce_alpha * ce + l1_alpha * l1) * weights).sum() / weights.sum()
    confidence_loss = (bce * valid).sum() / valid.sum()
    greedy_hit = (logits.argmax(-1) == label).float()
    return {"loss": draft_loss + CONFIDENCE_ALPHA * confidence_loss,
            "ce": (ce * weights).sum() / weights.sum(), "l1": (l1 * weights).sum() / weights.sum(),
            "bce": confidence_loss,
            "slot_hit": (greedy_hit * valid).sum(0) / valid.sum(0).clamp(min=1)}


def backward_share(out, sequences, sums):
    """Back-propagates one sequence's share of a step's loss (1 / sequences) and adds that share
    of its terms to sums (as tensors: reading them would wait for an accelerator every time)."""
    (out["loss"] / sequences).backward()
    for key in ("loss", "ce", "l1", "bce"):
        sums[key] = sums.get(key, 0.0) + out[key].detach() / sequences


def sample_anchors(sequence, count, rng, prompt_share):
    """Anchors from the answer (where decoding drafts) and, prompt_share of them, from the
    prompt (real text the target reads, labelled with the target's own predictions)."""
    n, start = len(sequence.tokens), sequence.prompt_tokens
    answer = np.arange(start, n - 1)
    prompt = np.arange(1, start)
    n_prompt = min(len(prompt), int(round(count * prompt_share))) if len(answer) else \
        min(len(prompt), count)
    n_answer = min(len(answer), count - n_prompt)
    picks = [rng.choice(answer, n_answer, replace=False)] if n_answer else []
    if n_prompt:
        picks.append(rng.choice(prompt, n_prompt, replace=False))
    return np.sort(np.concatenate(picks)).astype(np.int64)


def evaluate_blocks(head, sequences, args, anchors_per_sequence):
    """Held-out losses and teacher-forced greedy slot hit rates on fixed anchors. `sequences`
    yields (sequence, blocks): the sequence's tokens and prompt_tokens, and blocks(anchors), its
    blocks_of."""
    totals, count = {}, 0
    rng = np.random.default_rng(0)
    with torch.no_grad():
        for sequence, blocks in sequences:
            if len(sequence.tokens) - sequence.prompt_tokens < 2:
                continue
            anchors = sample_anchors(sequence, anchors_per_sequence, rng, 0.0)
            out = block_losses(head, blocks(anchors), args.gamma, args.ce_alpha, args.l1_alpha)
            for key, value in out.items():
                totals[key] = totals.get(key, 0) + value
            count += 1
    return {k: (v / count).tolist() for k, v in totals.items()}


def evaluate(head, sequences, layers, args, anchors_per_sequence):
    """evaluate_blocks over a shard's sequences."""
    return evaluate_blocks(head, ((s, lambda anchors, s=s: block_batch(s, anchors, layers))
                                  for s in sequences), args, anchors_per_sequence)


def lr_at(step, steps, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def plot(history, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    train = [h for h in history if h["kind"] == "train"]
    evals = [h for h in history if h["kind"] == "eval"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    steps = [h["step"] for h in train]
    loss = np.array([h["loss"] for h in train])
    smooth = np.convolve(loss, np.ones(25) / 25, mode="valid") if len(loss) >= 25 else loss
    axes[0].plot(steps, loss, alpha=0.3, label="train (per step)")
    axes[0].plot(steps[len(steps) - len(smooth):], smooth, label="train (25-step mean)")
    axes[0].plot([h["step"] for h in evals], [h["loss"] for h in evals], "o-",
                 label="held-out")
    axes[0].set_xlabel("optimizer step")
    axes[0].set_ylabel("loss")
    axes[0].legend()
    axes[0].set_title("DSpark head loss")
    if evals:
        hits = np.array([h["slot_hit"] for h in evals])
        for i in range(hits.shape[1]):
            axes[1].plot([h["step"] for h in evals], hits[:, i], label=f"slot {i}")
        axes[1].set_xlabel("optimizer step")
        axes[1].set_ylabel("held-out greedy top-1 = target (teacher forced)")
        axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def add_training_arguments(parser, **defaults):
    """The head's shape, the loss and the batches: train.py's settings, also distill.py's (with
    its own defaults)."""
    # ce_alpha: the paper's 0.1 / 0.9 learned slowly here from scratch: the L1 term's gradient is
    # tiny while the draft distribution is flat, and a full-weight CE term learns faster.
    d = {"taps": "9,17,25", "layers": 1, "markov_rank": 64, "sequences_per_step": 4,
         "anchors": 24, "prompt_share": 0.25, "lr": 1e-3, "warmup": 50, "gamma": 4.0,
         "ce_alpha": 1.0, "l1_alpha": 0.9, "max_rows": 768, "eval_every": 100, "seed": 19}
    d.update(defaults)
    # Each flag takes its default's type (--taps is a comma list, read as text).
    for name, default in d.items():
        parser.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)


def grown_state(head, exported):
    """The exported head's parameters in `head`'s shapes. A narrowed head (reduce_vocab.py) gives
    back its own lm_head rows (the target's) and its Markov rows go back to their target ids, the
    rows outside its draft vocabulary at zero as in a fresh head. A head trained shallower or at a
    lower Markov rank grows without changing what it computes: its layers come first and each
    added layer starts as the identity (o_proj and down_proj zero, the rest as init_from_target
    left them); the added rank columns of markov_w2 and of the confidence weights start at zero,
    markov_w1's keep their random start so that their gradients are not zero."""
    state = {k: v.clone() for k, v in head.state_dict().items()}
    rank, hidden = exported.config["markov_rank"], head.config["hidden_size"]
    for name, value in exported.state_dict().items():
        if name == "lm_head":
            continue
        if name == "markov_w1":
            state[name][:, :rank] = value
        elif name == "markov_w2":
            rows = exported.draft_ids if exported.lm_head is not None else slice(None)
            state[name].zero_()
            state[name][rows, :rank] = value
        elif name == "confidence_w":
            state[name].zero_()
            state[name][:, :hidden + rank] = value
        else:
            state[name] = value
    for i in range(exported.config["num_hidden_layers"], len(head.layers)):
        state[f"layers.{i}.o_proj"].zero_()
        state[f"layers.{i}.down_proj"].zero_()
    return state


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--init-layer", type=int, default=-1,
                        help="first target layer the backbone starts from (-1: the one after "
                             "the deepest tap, or the last ones)")
    parser.add_argument("--init-head", type=Path,
                        help="start from this exported head (RUN/head, or the committed one, "
                             "widened to the full vocabulary) instead of the target's layers: a "
                             "warm start on new data; one of fewer --layers or a lower "
                             "--markov-rank grows into them (grown_state)")
    parser.add_argument("--draft-vocab", type=int, default=0,
                        help="train the head narrowed to the N tokens of the most target "
                             "probability over the training answers (reduce_vocab.py's rule), "
                             "as it drafts at inference; 0: the whole vocabulary")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--minutes", type=float, default=0.0)
    parser.add_argument("--until-step", type=int, default=0,
                        help="end this invocation at this step (a rebuild of a run that was "
                             "stopped early stops where it did)")
    add_training_arguments(parser)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    start = time.monotonic()
    args.run_dir.mkdir(parents=True, exist_ok=True)
    settings_path = args.run_dir / "settings.json"
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()
                if k not in ("minutes", "until_step", "threads", "data_dir", "run_dir", "model")}
    if settings_path.exists():
        saved = json.loads(settings_path.read_text())
        if saved != settings:
            sys.exit(f"{settings_path} holds other settings ({saved}); use a new RUN_DIR")
    else:
        settings_path.write_text(json.dumps(settings, indent=2))

    layers = [int(x) for x in args.taps.split(",")]
    target = dspark_head.Target(args.model)
    config = dspark_head.head_config(target.config, layers, args.layers, args.markov_rank)
    torch.manual_seed(args.seed)
    head = dspark_head.DSparkHead(config, target.embedding())
    first = args.init_layer
    if first < 0:
        first = min(max(layers) + 1, target.config["num_hidden_layers"] - args.layers)
    head.init_from_target(target, first)
    if args.init_head:
        exported = dspark_head.DSparkHead.load_exported(args.init_head, target.embedding())
        exported_config = {k: v for k, v in exported.config.items() if k != "draft_vocab_size"}
        growable = ("num_hidden_layers", "markov_rank")
        if ({k: v for k, v in exported_config.items() if k not in growable} !=
                {k: v for k, v in config.items() if k not in growable} or
                any(exported_config[k] > config[k] for k in growable)):
            sys.exit(f"{args.init_head} is a head of other settings ({exported.config}); pass "
                     "the --taps it was trained with, and --layers and --markov-rank at least "
                     "its own")
        head.load_state_dict(grown_state(head, exported))
    train = [s for s in dspark_head.read_shards(args.data_dir / "train")
             if len(s.tokens) - s.prompt_tokens >= 2]
    if args.draft_vocab:
        vocab = target.config["vocab_size"]
        if not 0 < args.draft_vocab < vocab:
            sys.exit(f"--draft-vocab must be in 1..{vocab - 1}")
        head.narrow(reduce_vocab.choose(reduce_vocab.token_mass(train, vocab)[0],
                                        args.draft_vocab))
    optimizer = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=args.lr,
                                  weight_decay=0.0)
    step, history = 0, []
    checkpoint_path = args.run_dir / "checkpoint.pt"
    if checkpoint_path.exists():
        state = torch.load(checkpoint_path, weights_only=False)
        head.load_state_dict(state["head"])
        optimizer.load_state_dict(state["optimizer"])
        step, history = state["step"], state["history"]
        print(f"resumed at step {step}", flush=True)

    held_out = [s for s in dspark_head.read_shards(args.data_dir / "heldout")]
    for s in train:
        if len(s.tokens) > args.max_rows:
            s.tokens, s.taps = s.tokens[: args.max_rows], s.taps[: args.max_rows]
            s.top_ids, s.top_probs = s.top_ids[: args.max_rows], s.top_probs[: args.max_rows]
    answer_tokens = sum(len(s.tokens) - s.prompt_tokens for s in train)
    print(f"{len(train)} training sequences ({answer_tokens} answer tokens), "
          f"{len(held_out)} held-out", flush=True)

    def save():
        state = {"head": head.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                 "history": history}
        torch.save(state, str(checkpoint_path) + ".partial")
        Path(str(checkpoint_path) + ".partial").replace(checkpoint_path)

    log = open(args.run_dir / "log.jsonl", "a")
    while step < (args.until_step or args.steps):
        if args.minutes and time.monotonic() - start > args.minutes * 60:
            break
        rng = np.random.default_rng([args.seed, step])
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        optimizer.zero_grad()
        sums = {}
        for index in rng.choice(len(train), args.sequences_per_step, replace=False):
            sequence = train[index]
            anchors = sample_anchors(sequence, args.anchors, rng, args.prompt_share)
            out = block_losses(head, block_batch(sequence, anchors, layers), args.gamma,
                               args.ce_alpha, args.l1_alpha)
            backward_share(out, args.sequences_per_step, sums)
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        optimizer.step()
        step += 1
        record = {"kind": "train", "step": step, "lr": optimizer.param_groups[0]["lr"],
                  **{k: float(v) for k, v in sums.items()}}
        history.append(record)
        log.write(json.dumps(record) + "\n")
        if step % 10 == 0:
            print(f"step {step}/{args.steps} loss {record['loss']:.4f} ce {record['ce']:.3f} "
                  f"l1 {record['l1']:.3f} bce {record['bce']:.3f} "
                  f"({time.monotonic() - start:.0f} s)", flush=True)
        if step % args.eval_every == 0 or step == args.steps:
            record = {"kind": "eval", "step": step,
                      **evaluate(head, held_out, layers, args, 32)}
            history.append(record)
            log.write(json.dumps(record) + "\n")
            print(f"held-out step {step}: loss {record['loss']:.4f} slot hits "
                  + " ".join(f"{x:.2f}" for x in record["slot_hit"]), flush=True)
            save()
    # Every invocation ends with held-out figures for the head it exports.
    if not history or history[-1]["kind"] != "eval":
        history.append({"kind": "eval", "step": step,
                        **evaluate(head, held_out, layers, args, 32)})
        log.write(json.dumps(history[-1]) + "\n")
    save()
    plot(history, args.run_dir / "loss.png")
    head.export(args.run_dir / "head")
    print(f"step {step}: exported {args.run_dir / 'head'}", flush=True)


if __name__ == "__main__":
    main()
