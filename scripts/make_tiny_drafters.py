#!/usr/bin/env python3
"""Writes tiny random drafters in every packaging we load, for the drafter tests.

    make_tiny_drafters.py OUT_DIR [NAME ...]

Each drafter is a directory (config.json + model.safetensors, float32 so that MLX on the CPU is an
exact-enough oracle) shaped for one of the tiny targets of make_tiny_models.py (hidden 128,
vocab 512): `qwen3_tied` (2 layers) or `nemotron_attn` (6 layers). Packagings:
  deepspec_*     DeepSpec standalone (top-level keys, anchor slot predicts, bidirectional block)
  speculators_*  vLLM speculators (transformer_layer_config, aux_hidden_state_layer_ids,
                 proposal_methods -> logits_start)
  nemotron_*     NVIDIA's Nemotron head: causal block, sliding window, per-head sinks,
                 sample_from_anchor false, no lm_head (reuses the target's)
  dflash_*       z-lab DFlash (target embedding and lm_head, slots 1..B-1)
"""

import json
import os
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

HIDDEN = 128
VOCAB = 512
HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 4, 2, 32, 192
MASK = 511

# name: (packaging, target, options)
DRAFTERS = {
    "deepspec_a": ("deepspec", "qwen3_tied", dict(layers=2, block=7, taps=[-1, 0], rank=64, seed=1)),
    "deepspec_b": ("deepspec", "nemotron_attn", dict(layers=1, block=4, taps=[1, 3, 4], rank=128,
                                                    seed=2, lm_head=False)),
    "deepspec_c": ("deepspec", "qwen3_tied", dict(layers=3, block=5, taps=[0], rank=64, seed=3,
                                                 confidence=False)),
    "deepspec_d": ("deepspec", "nemotron_attn", dict(layers=2, block=6, taps=[0, 2], rank=0,
                                                    seed=4, confidence=False)),
    "speculators_a": ("speculators", "qwen3_tied", dict(layers=2, block=8, taps=[-1, 0], rank=64,
                                                       seed=11, speculative_tokens=7)),
    "speculators_b": ("speculators", "nemotron_attn", dict(layers=2, block=6, taps=[1, 4], rank=64,
                                                          seed=12, speculative_tokens=6)),
    "speculators_c": ("speculators", "qwen3_tied", dict(layers=1, block=5, taps=[0], rank=64,
                                                       seed=13, sliding_window=6)),
    "nemotron_a": ("nemotron", "nemotron_attn", dict(layers=2, block=8, taps=[1, 3, 4], rank=128,
                                                    seed=21, window=9)),
    "nemotron_b": ("nemotron", "nemotron_attn", dict(layers=1, block=6, taps=[0, 2], rank=64,
                                                    seed=22, window=1024, confidence=False)),
    "nemotron_c": ("nemotron", "qwen3_tied", dict(layers=3, block=5, taps=[-1, 0], rank=64,
                                                 seed=23, window=4)),
    "dflash_a": ("dflash", "qwen3_tied", dict(layers=2, block=8, taps=[-1, 0], seed=31)),
    "dflash_b": ("dflash", "nemotron_attn", dict(layers=3, block=5, taps=[1, 3, 4], seed=32,
                                                sliding=[True, False, True], window=7)),
    "dflash_c": ("dflash", "nemotron_attn", dict(layers=1, block=16, taps=[2], seed=33)),
}


def tensors(options, packaging, rng):
    def matrix(rows, cols):
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    t = {}
    H = HIDDEN
    taps = len(options["taps"])
    t["fc.weight"] = matrix(H, taps * H)
    t["hidden_norm.weight"] = norm(H)
    t["norm.weight"] = norm(H)
    for i in range(options["layers"]):
        p = f"layers.{i}"
        t[f"{p}.input_layernorm.weight"] = norm(H)
        t[f"{p}.post_attention_layernorm.weight"] = norm(H)
        t[f"{p}.self_attn.q_proj.weight"] = matrix(HEADS * HEAD_DIM, H)
        t[f"{p}.self_attn.k_proj.weight"] = matrix(KV_HEADS * HEAD_DIM, H)
        t[f"{p}.self_attn.v_proj.weight"] = matrix(KV_HEADS * HEAD_DIM, H)
        t[f"{p}.self_attn.o_proj.weight"] = matrix(H, HEADS * HEAD_DIM)
        t[f"{p}.self_attn.q_norm.weight"] = norm(HEAD_DIM)
        t[f"{p}.self_attn.k_norm.weight"] = norm(HEAD_DIM)
        t[f"{p}.mlp.gate_proj.weight"] = matrix(INTERMEDIATE, H)
        t[f"{p}.mlp.up_proj.weight"] = matrix(INTERMEDIATE, H)
        t[f"{p}.mlp.down_proj.weight"] = matrix(H, INTERMEDIATE)
        if packaging == "nemotron":
            t[f"{p}.self_attn.attention_sink_bias"] = rng.standard_normal(HEADS).astype(np.float32)
    if packaging == "dflash":
        return t
    t["embed_tokens.weight"] = rng.standard_normal((VOCAB, H)).astype(np.float32)
    if options.get("lm_head", packaging != "nemotron"):
        t["lm_head.weight"] = matrix(VOCAB, H) * 4.0
    rank = options["rank"]
    if rank:
        t["markov_head.markov_w1.weight"] = rng.standard_normal((VOCAB, rank)).astype(np.float32)
        t["markov_head.markov_w2.weight"] = matrix(VOCAB, rank)
    if options.get("confidence", True):
        t["confidence_head.proj.weight"] = matrix(1, H + rank)
        t["confidence_head.proj.bias"] = rng.standard_normal(1).astype(np.float32)
    return t


def backbone_config(options):
    return {
        "model_type": "qwen3",
        "hidden_size": HIDDEN,
        "vocab_size": VOCAB,
        "num_hidden_layers": options["layers"],
        "intermediate_size": INTERMEDIATE,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "attention_bias": False,
    }


def dspark_fields(options):
    return {
        "block_size": options["block"],
        "mask_token_id": MASK,
        "markov_rank": options["rank"],
        "markov_head_type": "vanilla",
        "enable_confidence_head": options.get("confidence", True),
        "confidence_head_with_markov": options["rank"] > 0,
    }


def config(packaging, options):
    if packaging == "deepspec":
        return {"architectures": ["Qwen3DSparkModel"], **backbone_config(options),
                **dspark_fields(options), "target_layer_ids": options["taps"],
                "num_target_layers": 6}
    if packaging == "speculators":
        layer = backbone_config(options)
        if options.get("sliding_window"):
            layer.update(layer_types=["sliding_attention"] * options["layers"],
                         use_sliding_window=True, sliding_window=options["sliding_window"])
        out = {"architectures": ["DSparkSpeculator"], "speculators_model_type": "dspark",
               "transformer_layer_config": layer, "aux_hidden_state_layer_ids": options["taps"],
               "draft_vocab_size": VOCAB, **dspark_fields(options)}
        methods = []
        if "speculative_tokens" in options:
            methods = [{"proposal_type": "greedy",
                        "speculative_tokens": options["speculative_tokens"]}]
        out["speculators_config"] = {"algorithm": "dspark", "proposal_methods": methods}
        return out
    if packaging == "nemotron":
        return {"architectures": ["Qwen3DSparkModel"], **backbone_config(options),
                **dspark_fields(options), "target_layer_ids": options["taps"],
                "dflash_query_causal": True, "sliding_window": options["window"],
                "attention_sink_bias": True, "sample_from_anchor": False, "has_lm_head": False}
    layer_types = ["sliding_attention" if s else "full_attention"
                   for s in options.get("sliding", [False] * options["layers"])]
    return {"architectures": ["DFlashDraftModel"], **backbone_config(options),
            "block_size": options["block"], "max_position_embeddings": 4096,
            "dflash_config": {"mask_token_id": MASK, "target_layer_ids": options["taps"]},
            "num_target_layers": 6, "layer_types": layer_types,
            "sliding_window": options.get("window")}


def build(name, out_dir):
    packaging, target, options = DRAFTERS[name]
    directory = Path(out_dir) / name
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(options["seed"])
    partial = f".partial-{os.getpid()}"
    save_file(tensors(options, packaging, rng), str(directory / f"model{partial}.safetensors"),
              metadata={"format": "mlx"})
    os.replace(directory / f"model{partial}.safetensors", directory / "model.safetensors")
    (directory / f"config{partial}.json").write_text(json.dumps(config(packaging, options), indent=2))
    os.replace(directory / f"config{partial}.json", directory / "config.json")
    return directory


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    for name in argv[2:] or DRAFTERS:
        print(build(name, argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
