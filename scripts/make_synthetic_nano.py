#!/usr/bin/env python3
"""Writes a synthetic Nemotron-3 Nano checkpoint for the decode benchmark.

Real Nano shapes (hidden 2688, 64 Mamba heads of 64, 8 groups of 128 states, 32/2 attention heads
of 128, 128 experts of 1856 with top-6 and a 3712-wide shared expert, vocab 131072) in the MLX
4-bit layout (affine, group 64, bf16 scales and biases), but only the first LAYERS layers of Nano's
pattern (default 8: MEMEM*EM, about 2.6 GB) and random weights. One shard per layer plus a shard
index, as mlx-lm writes large checkpoints. Nothing here is meant to produce sensible text: it
measures speed.

    make_synthetic_nano.py OUT_DIR [LAYERS]

OUT_DIR is rewritten only when its recipe changed. Never write it into the source tree.
"""

import json
import struct
import sys
from pathlib import Path

import numpy as np

NANO_PATTERN = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"
RECIPE_VERSION = 1
H, V = 2688, 131072
MAMBA_HEADS, MAMBA_HEAD_DIM, GROUPS, STATE, KERNEL = 64, 64, 8, 128, 4
HEADS, KV_HEADS, HEAD_DIM = 32, 2, 128
EXPERTS, TOP_K, EXPERT_WIDTH, SHARED_WIDTH = 128, 6, 1856, 3712
BITS, GROUP = 4, 64
D_INNER = MAMBA_HEADS * MAMBA_HEAD_DIM
CONV_DIM = D_INNER + 2 * GROUPS * STATE


def config(pattern):
    quant = {"group_size": GROUP, "bits": BITS, "mode": "affine"}
    return {
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "vocab_size": V,
        "hidden_size": H,
        "num_hidden_layers": len(pattern),
        "hybrid_override_pattern": pattern,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "attention_bias": False,
        "max_position_embeddings": 262144,
        "mamba_num_heads": MAMBA_HEADS,
        "mamba_head_dim": MAMBA_HEAD_DIM,
        "ssm_state_size": STATE,
        "n_groups": GROUPS,
        "conv_kernel": KERNEL,
        "chunk_size": 128,
        "use_conv_bias": True,
        "mamba_proj_bias": False,
        "use_bias": False,
        "n_routed_experts": EXPERTS,
        "n_shared_experts": 1,
        "num_experts_per_tok": TOP_K,
        "moe_intermediate_size": EXPERT_WIDTH,
        "moe_shared_expert_intermediate_size": SHARED_WIDTH,
        "intermediate_size": EXPERT_WIDTH,
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "mlp_bias": False,
        "layer_norm_epsilon": 1e-5,
        "tie_word_embeddings": False,
        "quantization": quant,
        "quantization_config": quant,
    }


def bf16(values):
    bits = np.asarray(values, dtype=np.float32).view(np.uint32)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    return (rounded >> 16).astype(np.uint16)


class Shard:
    """Collects tensor generators, then streams them into one safetensors file."""

    def __init__(self):
        self.entries = []  # (name, dtype, shape, nbytes, make)

    def add(self, name, dtype, shape, make):
        size = {"U32": 4, "BF16": 2, "F32": 4}[dtype] * int(np.prod(shape))
        self.entries.append((name, dtype, list(shape), size, make))

    def write(self, path):
        header, offset = {"__metadata__": {"format": "mlx"}}, 0
        for name, dtype, shape, size, _ in self.entries:
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
            offset += size
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(blob)))
            f.write(blob)
            for _, _, _, size, make in self.entries:
                data = np.ascontiguousarray(make())
                assert data.nbytes == size
                data.tofile(f)
        return [name for name, *_ in self.entries]


def add_quantized(shard, rng, path, out, cols, experts=None):
    lead = [experts] if experts else []
    words, groups = cols * BITS // 32, cols // GROUP
    shard.add(f"{path}.weight", "U32", lead + [out, words],
              lambda: rng.integers(0, 2**32, lead + [out, words], dtype=np.uint32))
    # Codes 0..15 spread the weights over ±amplitude: scale = 2·amplitude / 15, bias = -amplitude.
    amplitude = 1.7 / np.sqrt(cols)
    shard.add(f"{path}.scales", "BF16", lead + [out, groups],
              lambda: bf16(np.full(lead + [out, groups], 2 * amplitude / 15)))
    shard.add(f"{path}.biases", "BF16", lead + [out, groups],
              lambda: bf16(np.full(lead + [out, groups], -amplitude)))


def add_dense(shard, name, dtype, shape, make):
    if dtype == "BF16":
        shard.add(name, dtype, shape, lambda: bf16(make()))
    else:
        shard.add(name, dtype, shape, lambda: make().astype(np.float32))


def layer_shard(rng, index, kind):
    s, p = Shard(), f"backbone.layers.{index}"
    m = f"{p}.mixer"
    add_dense(s, f"{p}.norm.weight", "BF16", [H], lambda: np.ones(H))
    if kind == "M":
        add_quantized(s, rng, f"{m}.in_proj", D_INNER + CONV_DIM + MAMBA_HEADS, H)
        add_quantized(s, rng, f"{m}.out_proj", H, D_INNER)
        add_dense(s, f"{m}.conv1d.weight", "BF16", [CONV_DIM, KERNEL, 1],
                  lambda: rng.normal(0, 0.3, [CONV_DIM, KERNEL, 1]))
        add_dense(s, f"{m}.conv1d.bias", "BF16", [CONV_DIM], lambda: rng.normal(0, 0.1, CONV_DIM))
        add_dense(s, f"{m}.dt_bias", "BF16", [MAMBA_HEADS],
                  lambda: rng.normal(-2.0, 0.5, MAMBA_HEADS))
        add_dense(s, f"{m}.A_log", "F32", [MAMBA_HEADS],
                  lambda: np.log(rng.uniform(1, 16, MAMBA_HEADS)))
        add_dense(s, f"{m}.D", "BF16", [MAMBA_HEADS], lambda: np.ones(MAMBA_HEADS))
        add_dense(s, f"{m}.norm.weight", "BF16", [D_INNER], lambda: np.ones(D_INNER))
    elif kind == "*":
        add_quantized(s, rng, f"{m}.q_proj", HEADS * HEAD_DIM, H)
        add_quantized(s, rng, f"{m}.k_proj", KV_HEADS * HEAD_DIM, H)
        add_quantized(s, rng, f"{m}.v_proj", KV_HEADS * HEAD_DIM, H)
        add_quantized(s, rng, f"{m}.o_proj", H, HEADS * HEAD_DIM)
    elif kind == "E":
        add_dense(s, f"{m}.gate.weight", "BF16", [EXPERTS, H],
                  lambda: rng.normal(0, 1 / np.sqrt(H), [EXPERTS, H]))
        add_dense(s, f"{m}.gate.e_score_correction_bias", "F32", [EXPERTS],
                  lambda: rng.normal(0, 0.01, EXPERTS))
        add_quantized(s, rng, f"{m}.switch_mlp.fc1", EXPERT_WIDTH, H, EXPERTS)
        add_quantized(s, rng, f"{m}.switch_mlp.fc2", H, EXPERT_WIDTH, EXPERTS)
        add_quantized(s, rng, f"{m}.shared_experts.up_proj", SHARED_WIDTH, H)
        add_quantized(s, rng, f"{m}.shared_experts.down_proj", H, SHARED_WIDTH)
    else:
        raise ValueError(f"layer kind {kind!r} is not in Nano's pattern")
    return s


def top_shard(rng):
    s = Shard()
    add_quantized(s, rng, "backbone.embeddings", V, H)
    add_quantized(s, rng, "lm_head", V, H)
    add_dense(s, "backbone.norm_f.weight", "BF16", [H], lambda: np.ones(H))
    return s


def build(out_dir, layers):
    pattern = NANO_PATTERN[:layers]
    out = Path(out_dir)
    recipe = {"version": RECIPE_VERSION, "pattern": pattern}
    stamp = out / "recipe.json"
    if stamp.exists() and json.loads(stamp.read_text()) == recipe:
        return out
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("model*.safetensors"):
        old.unlink()
    rng = np.random.default_rng(1234)
    shards = [top_shard(rng)] + [layer_shard(rng, i, k) for i, k in enumerate(pattern)]
    weight_map = {}
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        for name in shard.write(out / file):
            weight_map[name] = file
    total = sum(size for shard in shards for _, _, _, size, _ in shard.entries)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    (out / "config.json").write_text(json.dumps(config(pattern), indent=2) + "\n")
    stamp.write_text(json.dumps(recipe))
    return out


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    layers = int(argv[2]) if len(argv) > 2 else 8
    if not 1 <= layers <= len(NANO_PATTERN):
        print(f"LAYERS must be in 1..{len(NANO_PATTERN)}")
        return 2
    print(build(argv[1], layers))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
