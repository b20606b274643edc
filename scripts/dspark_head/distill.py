#!/usr/bin/env python3
"""Self-distillation of the default model's DSpark head on a CUDA GPU (docs/training.md, "On a
GPU"): the same head, loss and export as train.py, with the target run in PyTorch instead of
read from make_dataset.py's shards, so data is no longer the limit.

    distill.py prompts PROMPTS.json                  # here: dspark's own chat rendering + ids
    distill.py generate PROMPTS.json GEN.pt [--sampled 0.7,1.0] [--max-tokens 192]
    distill.py train GEN.pt RUN [--layers 1] [--steps N | --minutes M] [train.py's settings]
    distill.py check PROMPTS.json DATA               # the port against dspark's own shards

`generate` has the target answer every training prompt greedily and once per --sampled
temperature (seeded), and the held-out prompts greedily; `train` draws each step's sequences,
runs the target over them (no gradient) for the taps and the top-32 next-token distribution of
every row, and trains on them with train.py's block_losses; RUN/head is exported (as train.py
does) at every held-out evaluation, with RUN/vocab-mass.npz, the token masses that
reduce_vocab.py narrows the head with.

The target here is a PyTorch port of the checkpoint with dspark's default numerics written out
(MLX weights dequantized to float32, each quantized product's input rounded to int8 in blocks of
32, the KV cache rounded to float16). It is not bit-exact: summation order differs, and int8
rounding turns such differences into whole steps, as between any two engines. On dspark's
held-out shards (`check`) its taps differ by at most 8.8e-4 of their largest value (a plain
float32 port: 3.2e-3) and 97.5 % of the rows have dspark's top-1 token (float32: 97.6 %).
`evaluate.py offline` then measures the head on dspark's own held-out shards.
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dspark_head  # noqa: E402
import train  # noqa: E402

SOURCE_DIR = Path(__file__).resolve().parents[2]
PROMPTS_DIR = SOURCE_DIR / "data/dspark_head"
TOP_K = 32


def int8_rows(x):
    """dspark's default numerics for the input of a quantized product (src/kernels/quant.h):
    each row in blocks of 32, d = max|x| / 127, x8 = round-half-even(x / d) in [-127, 127]; the
    product is then exactly W @ (d * x8)."""
    blocks = x.reshape(*x.shape[:-1], -1, 32)
    d = blocks.abs().amax(-1, keepdim=True) / 127
    x8 = torch.where(d > 0, torch.round(blocks / torch.where(d > 0, d, 1)).clamp(-127, 127), 0)
    return (x8 * d).reshape(x.shape)


class TorchTarget:
    """The llama target (SmolLM2) in PyTorch: the residual stream after chosen layers and the
    tied head's logits, over a batch with per-row positions and an optional KV cache."""

    def __init__(self, model_dir, device, numerics="int8"):
        target = dspark_head.Target(model_dir)
        self.product_input = int8_rows if numerics == "int8" else (lambda x: x)
        self.config = c = target.config
        self.heads, self.kv = c["num_attention_heads"], c["num_key_value_heads"]
        self.hd = c.get("head_dim", c["hidden_size"] // self.heads)
        self.eps = c["rms_norm_eps"]
        self.embedding_cpu = target.embedding()
        self.embedding = self.embedding_cpu.to(device)
        self.layers = []
        for i in range(c["num_hidden_layers"]):
            p = f"model.layers.{i}"
            names = {"in_norm": ".input_layernorm", "post_norm": ".post_attention_layernorm",
                     "q": ".self_attn.q_proj", "k": ".self_attn.k_proj", "v": ".self_attn.v_proj",
                     "o": ".self_attn.o_proj", "gate": ".mlp.gate_proj", "up": ".mlp.up_proj",
                     "down": ".mlp.down_proj"}
            self.layers.append({k: target.weight(p + v).to(device) for k, v in names.items()})
        self.norm = target.weight("model.norm").to(device)
        inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, self.hd, 2, dtype=torch.float64)
                                              / self.hd))
        positions = torch.arange(c.get("max_position_embeddings", 8192), dtype=torch.float64)
        angles = positions[:, None] * inv_freq
        self.cos = torch.cos(angles).float().to(device)
        self.sin = torch.sin(angles).float().to(device)
        self.device = device

    def rope(self, x, positions):
        """Half-split RoPE; x [B, L, heads, hd], positions [B, L]."""
        return dspark_head.rotate_half_split(x, self.cos[positions][:, :, None, :],
                                             self.sin[positions][:, :, None, :])

    def forward(self, ids, positions, mask=None, cache=None, offset=0, taps=()):
        """Final hidden state (before the norm) [B, L, H] and the residual stream after each
        layer of `taps`. mask None means causal over these L rows alone (no cache)."""
        B, L = ids.shape
        x = self.embedding[ids]
        tapped = []
        for i, w in enumerate(self.layers):
            a = self.product_input(dspark_head.rms_norm(x, w["in_norm"], self.eps))
            q = self.rope((a @ w["q"].T).view(B, L, self.heads, self.hd), positions)
            k = self.rope((a @ w["k"].T).view(B, L, self.kv, self.hd), positions)
            v = (a @ w["v"].T).view(B, L, self.kv, self.hd)
            # dspark's KV cache holds float16 (docs/architecture.md).
            q, k, v = q.transpose(1, 2), k.transpose(1, 2).half().float(), \
                v.transpose(1, 2).half().float()
            if cache is not None:
                cache[i][0][:, :, offset:offset + L] = k
                cache[i][1][:, :, offset:offset + L] = v
                k, v = cache[i][0][:, :, :offset + L], cache[i][1][:, :, :offset + L]
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                               enable_gqa=True)
            x = x + self.product_input(o.transpose(1, 2).reshape(B, L, -1)) @ w["o"].T
            m = self.product_input(dspark_head.rms_norm(x, w["post_norm"], self.eps))
            x = x + self.product_input(F.silu(m @ w["gate"].T) * (m @ w["up"].T)) @ w["down"].T
            if i in taps:
                tapped.append(x)
        return x, tapped

    def logits(self, x):
        return self.product_input(dspark_head.rms_norm(x, self.norm, self.eps)) @ self.embedding.T

    def new_cache(self, batch, length):
        shape = (batch, self.kv, length, self.hd)
        return [(torch.zeros(shape, device=self.device), torch.zeros(shape, device=self.device))
                for _ in self.layers]


@torch.no_grad()
def answer(target, prompts, max_tokens, temperature, generator, eos_ids):
    """Answers of a batch of prompts (lists of ids), left-padded so every row's next position
    is the same cache column; a row stops at its first end-of-turn id (kept) or max_tokens."""
    device = target.device
    B, P = len(prompts), max(len(p) for p in prompts)
    pad = torch.tensor([P - len(p) for p in prompts], device=device)
    ids = torch.zeros((B, P), dtype=torch.long, device=device)
    for i, p in enumerate(prompts):
        ids[i, P - len(p):] = torch.tensor(p, device=device)
    columns = torch.arange(P + max_tokens, device=device)
    key_valid = columns[None, :] >= pad[:, None]
    positions = (columns[None, :P] - pad[:, None]).clamp(min=0)
    causal = columns[None, :P, None] >= columns[None, None, :P]
    # A padding row sees itself only, so no softmax row is empty; no real row sees it.
    mask = (causal & key_valid[:, None, :P]) | torch.eye(P, dtype=torch.bool, device=device)
    cache = target.new_cache(B, P + max_tokens)
    x, _ = target.forward(ids, positions, mask[:, None], cache, 0)
    logits = target.logits(x[:, -1])
    out = torch.zeros((B, max_tokens), dtype=torch.long, device=device)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    lengths = torch.full((B,), max_tokens, device=device)
    eos = torch.tensor(sorted(eos_ids), device=device)
    for t in range(max_tokens):
        if temperature > 0:
            probs = torch.softmax(logits / temperature, dim=-1)
            token = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        else:
            token = logits.argmax(-1)
        out[:, t] = token
        finished = torch.isin(token, eos) & ~done
        lengths[finished] = t + 1
        done |= finished
        if bool(done.all()) or t + 1 == max_tokens:
            break
        positions = (P + t - pad)[:, None]
        mask = key_valid[:, None, None, :P + t + 1]
        x, _ = target.forward(token[:, None], positions, mask, cache, P + t)
        logits = target.logits(x[:, -1])
    return [out[i, : int(lengths[i])].tolist() for i in range(B)]


def command_prompts(args):
    """Every prompt rendered with the model's chat template and tokenized by dspark itself
    (dspark_tool_chat_prompt), so the ids are the ones `dspark generate` and the taps tool use."""
    model = args.model
    template = json.loads((model / "tokenizer_config.json").read_text())["chat_template"]
    records = [dict(json.loads(line), split="train")
               for line in (PROMPTS_DIR / "train.jsonl").read_text().splitlines()]
    for suite in ("chat", "code", "math"):
        for line in (PROMPTS_DIR / "heldout" / f"{suite}.jsonl").read_text().splitlines():
            record = json.loads(line)
            records.append({"id": record["id"], "suite": suite, "text": record["prompt"],
                            "split": "heldout"})
    with tempfile.TemporaryDirectory() as tmp:
        template_path = Path(tmp) / "template.jinja"
        template_path.write_text(template)
        cases = [{"tokenizer": str(model / "tokenizer.json"), "template_file": str(template_path),
                  "messages": [{"role": "user", "content": r["text"]}],
                  "add_generation_prompt": True} for r in records]
        (Path(tmp) / "cases.json").write_text(json.dumps({"cases": cases}))
        subprocess.run([args.tool, str(Path(tmp) / "cases.json"), str(Path(tmp) / "out.json")],
                       check=True)
        results = json.loads((Path(tmp) / "out.json").read_text())
    out = {"train": [], "heldout": []}
    for record, result in zip(records, results):
        if not result.get("ok"):
            sys.exit(f"{record['id']}: {result.get('error')}")
        out[record["split"]].append({"id": record["id"], "suite": record["suite"],
                                     "ids": result["ids"]})
    args.out.write_text(json.dumps(out))
    print(f"{len(out['train'])} training and {len(out['heldout'])} held-out prompts, "
          f"{sum(len(r['ids']) for r in out['train'])} training prompt tokens")


def command_generate(args):
    # TF32 would round the int8-exact products of TorchTarget again.
    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device(args.device)
    target = TorchTarget(args.model, device)
    prompts = json.loads(args.prompts.read_text())
    if args.limit:
        prompts = {split: records[:args.limit] for split, records in prompts.items()}
    eos_ids = {target.config["eos_token_id"]} if isinstance(target.config["eos_token_id"], int) \
        else set(target.config["eos_token_id"])
    jobs = [(r, 0.0, "heldout") for r in prompts["heldout"]]
    jobs += [(r, 0.0, "train") for r in prompts["train"]]
    for temperature in (float(t) for t in args.sampled.split(",") if t):
        jobs += [(r, temperature, "train") for r in prompts["train"]]
    start = time.monotonic()
    sequences = {"train": [], "heldout": []}
    for temperature in sorted({j[1] for j in jobs}):
        group = sorted((j for j in jobs if j[1] == temperature), key=lambda j: len(j[0]["ids"]))
        generator = torch.Generator(device=device).manual_seed(args.seed + int(temperature * 100))
        for first in range(0, len(group), args.batch):
            batch = group[first:first + args.batch]
            answers = answer(target, [j[0]["ids"] for j in batch], args.max_tokens, temperature,
                             generator, eos_ids)
            for (record, t, split), ids in zip(batch, answers):
                sequences[split].append({"id": f"{record['id']}@T{t:g}", "suite": record["suite"],
                                         "prompt_tokens": len(record["ids"]),
                                         "tokens": record["ids"] + ids})
            done = sum(len(s["tokens"]) - s["prompt_tokens"] for v in sequences.values()
                       for s in v)
            print(f"T={temperature:g}: {first + len(batch)}/{len(group)} prompts, {done} answer "
                  f"tokens in all ({time.monotonic() - start:.0f} s)", flush=True)
    torch.save({"settings": {k: str(v) for k, v in vars(args).items()}, **sequences}, args.out)


class Rows:
    """The target's view of a batch of sequences: fused taps and top-k distributions per row."""

    def __init__(self, target, sequences, taps, top_k, max_rows):
        device = target.device
        tokens = [s["tokens"][:max_rows] for s in sequences]
        L = max(len(t) for t in tokens)
        ids = torch.zeros((len(tokens), L), dtype=torch.long)
        for i, t in enumerate(tokens):
            ids[i, : len(t)] = torch.tensor(t)
        self.ids = ids.to(device)
        positions = torch.arange(L, device=device)[None, :].expand(len(tokens), L)
        with torch.no_grad():
            # Right padding under a causal mask leaves every real row as it is alone.
            x, tapped = target.forward(self.ids, positions, taps=set(taps))
            # Rounded as the shards store them (float16), which is what the head sees in dspark.
            self.taps = torch.cat(tapped, dim=-1).half().float()
            probs = torch.softmax(target.logits(x), dim=-1)
            self.top_probs, self.top_ids = probs.topk(top_k, dim=-1)
        self.lengths = [len(t) for t in tokens]
        self.prompt_tokens = [min(s["prompt_tokens"], len(t)) for s, t in zip(sequences, tokens)]

    def blocks(self, s, anchors):
        """train.blocks_of for sequence s of this batch."""
        n = self.lengths[s]
        return train.blocks_of(self.ids[s, :n], self.top_ids[s, :n], self.top_probs[s, :n],
                               self.taps[s], torch.from_numpy(anchors).to(self.ids.device))

    def answer_mass(self, s, mass, counts):
        """Adds sequence s's answer rows to the per-token probability mass (reduce_vocab.py)."""
        first, last = self.prompt_tokens[s] - 1, self.lengths[s] - 1
        mass.index_add_(0, self.top_ids[s, first:last].flatten(),
                        self.top_probs[s, first:last].flatten().double())
        counts.index_add_(0, self.ids[s, first + 1:last + 1],
                          torch.ones(last - first, dtype=torch.float64, device=mass.device))


def evaluate(head, target, held_out, layers, args):
    """train.evaluate_blocks over the held-out answers, the target run batch by batch."""
    def sequences():
        for first in range(0, len(held_out), args.sequences_per_step):
            batch = held_out[first:first + args.sequences_per_step]
            rows = Rows(target, batch, layers, TOP_K, args.max_rows)
            for s in range(len(batch)):
                view = SimpleNamespace(tokens=np.zeros(rows.lengths[s]),
                                       prompt_tokens=rows.prompt_tokens[s])
                yield view, lambda anchors, s=s, rows=rows: rows.blocks(s, anchors)

    return train.evaluate_blocks(head, sequences(), args, 32)


def command_check(args):
    """TorchTarget against make_dataset.py's shards (dspark's int8 numerics): the prompt ids,
    the taps, the top-1 token of every row and the greedy answers."""
    device = torch.device(args.device)
    target = TorchTarget(args.model, device, args.numerics)
    prompts = json.loads(args.prompts.read_text())
    ids = {r["id"]: r["ids"] for split in prompts.values() for r in split}
    shards = dspark_head.read_shards(args.data_dir)
    layers = shards[0].shard_taps
    prompt_mismatches = sum(list(s.tokens[: s.prompt_tokens]) != ids[s.id.split("@")[0]]
                            for s in shards)
    tap_error, agree, rows = 0.0, 0, 0
    for first in range(0, len(shards), 8):
        batch = shards[first:first + 8]
        view = Rows(target, [{"tokens": list(s.tokens), "prompt_tokens": s.prompt_tokens}
                             for s in batch], layers, TOP_K, 10 ** 6)
        for i, s in enumerate(batch):
            n = len(s.tokens)
            reference = torch.from_numpy(s.taps.reshape(n, -1).astype(np.float32))
            tap_error = max(tap_error, float((view.taps[i, :n].cpu() - reference).abs().max()
                                             / reference.abs().max()))
            agree += int((view.top_ids[i, :n, 0].cpu().numpy() == s.top_ids[:, 0]).sum())
            rows += n
    greedy = [s for s in shards if s.id.endswith("@T0")][: args.answers]
    answers = answer(target, [list(s.tokens[: s.prompt_tokens]) for s in greedy],
                     args.answer_tokens, 0.0, None, {target.config["eos_token_id"]})
    same = sum(a == list(s.tokens[s.prompt_tokens:s.prompt_tokens + len(a)])
               for a, s in zip(answers, greedy))
    print(json.dumps({"sequences": len(shards), "numerics": args.numerics,
                      "prompt_id_mismatches": prompt_mismatches, "rows": rows,
                      "top1_agreement": round(agree / rows, 4),
                      "largest_tap_difference_of_largest_tap": round(tap_error, 5),
                      "greedy_answers_equal": f"{same}/{len(greedy)} "
                                              f"(first {args.answer_tokens} tokens)"}, indent=2))


def command_train(args):
    # TF32 would round the int8-exact products of TorchTarget again.
    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device(args.device)
    start = time.monotonic()
    args.run_dir.mkdir(parents=True, exist_ok=True)
    layers = [int(x) for x in args.taps.split(",")]
    if layers != sorted(layers):
        sys.exit("--taps must be in ascending order")
    target = TorchTarget(args.model, device)
    config = dspark_head.head_config(target.config, layers, args.layers, args.markov_rank)
    torch.manual_seed(args.seed)
    head = dspark_head.DSparkHead(config, target.embedding_cpu)
    first = min(max(layers) + 1, target.config["num_hidden_layers"] - args.layers)
    head.init_from_target(dspark_head.Target(args.model), first)
    head.to(device)
    optimizer = torch.optim.AdamW(head.parameters(), lr=args.lr, weight_decay=0.0)
    data = torch.load(args.generated, weights_only=False)
    sequences = [s for s in data["train"] if len(s["tokens"]) - s["prompt_tokens"] >= 2]
    held_out = data["heldout"]
    vocab = target.config["vocab_size"]
    mass = torch.zeros(vocab, dtype=torch.float64, device=device)
    counts = torch.zeros(vocab, dtype=torch.float64, device=device)
    seen = np.zeros(len(sequences), dtype=bool)
    print(f"{len(sequences)} training sequences "
          f"({sum(len(s['tokens']) - s['prompt_tokens'] for s in sequences)} answer tokens), "
          f"{len(held_out)} held-out", flush=True)
    steps, history = args.steps, []
    log = open(args.run_dir / "log.jsonl", "w")
    step = 0
    while steps == 0 or step < steps:
        if steps == 0 and step == args.probe_steps:
            # Fix the schedule's length from the measured step time, so --minutes fits.
            per_step = (time.monotonic() - probe_start) / (args.probe_steps - 1)
            steps = max(args.probe_steps + 1,
                        int((args.minutes * 60 - (time.monotonic() - start)) / per_step))
            print(f"{per_step * 1000:.0f} ms a step: {steps} steps", flush=True)
        if step == 1:
            probe_start = time.monotonic()
        rng = np.random.default_rng([args.seed, step])
        schedule = steps or 10 ** 9
        for group in optimizer.param_groups:
            group["lr"] = train.lr_at(step, schedule, args.lr, args.warmup)
        optimizer.zero_grad()
        picks = rng.choice(len(sequences), args.sequences_per_step, replace=False)
        rows = Rows(target, [sequences[i] for i in picks], layers, TOP_K, args.max_rows)
        sums = {}
        for s, index in enumerate(picks):
            if not seen[index]:
                seen[index] = True
                rows.answer_mass(s, mass, counts)
            view = SimpleNamespace(tokens=np.zeros(rows.lengths[s]),
                                   prompt_tokens=rows.prompt_tokens[s])
            anchors = train.sample_anchors(view, args.anchors, rng, args.prompt_share)
            out = train.block_losses(head, rows.blocks(s, anchors), args.gamma, args.ce_alpha,
                                     args.l1_alpha)
            train.backward_share(out, args.sequences_per_step, sums)
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        optimizer.step()
        step += 1
        if step % 25 == 0:
            record = {"kind": "train", "step": step, "lr": optimizer.param_groups[0]["lr"],
                      **{k: float(v) for k, v in sums.items()}}
            history.append(record)
            log.write(json.dumps(record) + "\n")
            print(f"step {step}/{steps} loss {record['loss']:.4f} ce {record['ce']:.3f} "
                  f"l1 {record['l1']:.3f} bce {record['bce']:.3f} "
                  f"({time.monotonic() - start:.0f} s)", flush=True)
        if step % args.eval_every == 0 or step == steps:
            record = {"kind": "eval", "step": step,
                      **evaluate(head, target, held_out, layers, args)}
            history.append(record)
            log.write(json.dumps(record) + "\n")
            log.flush()
            print(f"held-out step {step}: loss {record['loss']:.4f} slot hits "
                  + " ".join(f"{x:.2f}" for x in record["slot_hit"]), flush=True)
            head.export(args.run_dir / "head")
            np.savez(args.run_dir / "vocab-mass.npz", mass=mass.cpu().numpy(),
                     answers=counts.cpu().numpy(), sequences=int(seen.sum()))
    train.plot(history, args.run_dir / "loss.png")
    summary = {"settings": {k: str(v) for k, v in vars(args).items()}, "steps": steps,
               "seconds": round(time.monotonic() - start), "sequences_seen": int(seen.sum()),
               "generated": data["settings"],
               "held_out_loss": {h["step"]: round(h["loss"], 4) for h in history
                                 if h["kind"] == "eval"}}
    (args.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"step {step}: exported {args.run_dir / 'head'}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=train.MODEL)
    parser.add_argument("--device", default="cuda")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prompts")
    p.add_argument("out", type=Path)
    p.add_argument("--tool", default=str(SOURCE_DIR / "build/tests/dspark_tool_chat_prompt"))
    p = sub.add_parser("generate")
    p.add_argument("prompts", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--sampled", default="0.7,1.0",
                   help="temperatures at which every training prompt is also answered")
    p.add_argument("--max-tokens", type=int, default=192)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--seed", type=int, default=41)
    p.add_argument("--limit", type=int, default=0, help="the first N prompts of each split")
    p = sub.add_parser("check")
    p.add_argument("prompts", type=Path)
    p.add_argument("data_dir", type=Path, help="make_dataset.py shards (the held-out split)")
    p.add_argument("--numerics", choices=["int8", "fp32"], default="int8")
    p.add_argument("--answers", type=int, default=12, help="greedy answers to compare")
    p.add_argument("--answer-tokens", type=int, default=32)
    p = sub.add_parser("train")
    p.add_argument("generated", type=Path)
    p.add_argument("run_dir", type=Path)
    p.add_argument("--steps", type=int, default=0, help="0: as many as --minutes allows")
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--probe-steps", type=int, default=30)
    train.add_training_arguments(p, taps="1,9,17,25,28", sequences_per_step=16, anchors=48,
                                 warmup=100, eval_every=500, seed=43)
    args = parser.parse_args()
    {"prompts": command_prompts, "generate": command_generate, "check": command_check,
     "train": command_train}[args.command](args)


if __name__ == "__main__":
    main()
