#!/usr/bin/env python3
"""Writes a reduced Nemotron-3 Nano / 3.5-Lightning 30B-A3B as a Hugging Face bf16 checkpoint.

The real widths (hidden 2688, 64 Mamba-2 heads of 64 with 8 groups of 128 states, conv kernel 4,
chunk 128; 32 / 2 attention heads of 128; 128 relu² experts of 1856 with top-6 sigmoid routing,
`n_group` 1, `topk_group` 1, `norm_topk_prob`, `routed_scaling_factor` 2.5 and an
`e_score_correction_bias`, plus one 3712-wide shared expert; vocabulary 131072) for the first LAYERS
layers of the real 52-layer pattern (default 8: MEMEM*EM), in the layout NVIDIA publishes: the real
config.json (tests/fixtures/public/nemotron-3-nano) with the layer count cut, the HF tensor names
(`backbone.layers.{l}.mixer.experts.{e}.up_proj.weight`, `…conv1d.weight` as [C, 1, K], …), bf16
safetensors shards with an index. So any HF converter can read it: llama.cpp's
convert_hf_to_gguf.py and `dspark convert --hf` (docs/benchmarks/nemotron-h-llama-cpp.md).

    make_reduced_nemotron_hf.py OUT_DIR [--layers 8]
    make_reduced_nemotron_hf.py OUT_DIR --balance-routers TOOL --mlx MLX_DIR

The numbers follow scripts/make_synthetic_nano.py's recipe, in bf16 instead of quantized codes:
every matrix uniform in ±1.7/√in (what its uniform 4-bit codes dequantize to), the routed and
shared down projections zero-sum in every block of 8 inputs (the second half the negation of the
first, as its complemented codes), its router rows and correction bias, Mamba-2's A_log / dt_bias
initialisation, unit norms and D. The tokenizer is the Nemotron-structured fixture
(tests/fixtures/nemotron-tiny, 8,000 tokens); ids past it are unused. MEMEM*EM holds 4 Mamba-2,
3 MoE and 1 attention layer.

`--balance-routers` is make_synthetic_nano's router balancing: it runs on MLX_DIR (this checkpoint
after `dspark convert --hf`, whose router weights are the same bf16 values and whose correction
biases stay F32), patching MLX_DIR in place, then copies the balanced biases into OUT_DIR's shards,
so both stay what `dspark convert --hf` would make of the balanced checkpoint.

Memory stays bounded (one 64 MB chunk at a time); a shard whose header carries the same recipe is
kept, so a rerun resumes. 9.55 GB of tensors at 8 layers: write it under ~/.cache/dspark/synthetic/.
"""

import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_synthetic_nano as nano  # noqa: E402  (constants, bf16, Shard, router, balancing)
from make_synthetic_nano import (  # noqa: E402
    CHUNK_BYTES, CONV_DIM, D_INNER, EXPERT_WIDTH, EXPERTS, GROUPS, HEAD_DIM, HEADS, H, KERNEL,
    KV_HEADS, MAMBA_HEADS, NANO_PATTERN, SEED, SHARED_WIDTH, STATE, V, bf16)

ROOT = Path(__file__).resolve().parents[1]
REAL_CONFIG = ROOT / "tests/fixtures/public/nemotron-3-nano/config.from-jax-test-literal.json"
RECIPE_VERSION = 1


class HfShard(nano.Shard):
    """make_synthetic_nano's shard writer with the metadata torch's safetensors writes."""

    def header(self, recipe):
        header, offset = {"__metadata__": {"format": "pt", "dspark_recipe": recipe}}, 0
        for name, dtype, shape, size, _ in self.entries:
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
            offset += size
        blob = json.dumps(header, separators=(",", ":")).encode()
        return blob + b" " * (-len(blob) % 8)


def config(pattern):
    """The real config.json with the layer count cut; auto_map dropped (no remote code here)."""
    cfg = json.loads(REAL_CONFIG.read_text())
    cfg.pop("auto_map", None)
    cfg["num_hidden_layers"] = len(pattern)
    cfg["hybrid_override_pattern"] = pattern
    expected = {"hidden_size": H, "vocab_size": V, "mamba_num_heads": MAMBA_HEADS,
                "mamba_head_dim": D_INNER // MAMBA_HEADS, "n_groups": GROUPS,
                "ssm_state_size": STATE, "conv_kernel": KERNEL, "num_attention_heads": HEADS,
                "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
                "n_routed_experts": EXPERTS, "num_experts_per_tok": nano.TOP_K,
                "moe_intermediate_size": EXPERT_WIDTH,
                "moe_shared_expert_intermediate_size": SHARED_WIDTH}
    for key, value in expected.items():
        assert cfg[key] == value, (key, cfg[key], value)
    return cfg


def uniform_chunks(rng, rows, cols, balanced=False):
    """bf16 uniform(±1.7/√cols) rows, CHUNK_BYTES of float32 at a time.

    balanced: each block of 8 inputs is (x0..x3, -x0..-x3), so every block sums to zero exactly.
    """
    amplitude = np.float32(1.7 / np.sqrt(cols))
    step = max(1, CHUNK_BYTES // (4 * cols))
    for first in range(0, rows, step):
        n = min(step, rows - first)
        if balanced:
            half = rng.random((n, cols // 8, 4), dtype=np.float32) * (2 * amplitude) - amplitude
            values = np.concatenate([half, -half], axis=2).reshape(n, cols)
        else:
            values = rng.random((n, cols), dtype=np.float32) * (2 * amplitude) - amplitude
        yield bf16(values)


def add_matrix(shard, rng, name, rows, cols, balanced=False):
    shard.add(name, "BF16", [rows, cols], lambda: uniform_chunks(rng, rows, cols, balanced))


def layer_shard(rng, index, kind):
    s, p = HfShard(), f"backbone.layers.{index}"
    m = f"{p}.mixer"
    nano.add_dense(s, f"{p}.norm.weight", "BF16", [H], lambda: np.ones(H))
    if kind == "M":
        add_matrix(s, rng, f"{m}.in_proj.weight", D_INNER + CONV_DIM + MAMBA_HEADS, H)
        # torch's depthwise Conv1d weight is [channels, 1, kernel] (MLX's is [channels, kernel, 1])
        nano.add_dense(s, f"{m}.conv1d.weight", "BF16", [CONV_DIM, 1, KERNEL],
                       lambda: rng.normal(0, 0.3, [CONV_DIM, 1, KERNEL]))
        nano.add_dense(s, f"{m}.conv1d.bias", "BF16", [CONV_DIM],
                       lambda: rng.normal(0, 0.1, CONV_DIM))
        nano.add_dense(s, f"{m}.dt_bias", "BF16", [MAMBA_HEADS], lambda: nano.mamba_dt_bias(rng))
        nano.add_dense(s, f"{m}.A_log", "F32", [MAMBA_HEADS],
                       lambda: np.log(rng.uniform(1, 16, MAMBA_HEADS)))
        nano.add_dense(s, f"{m}.D", "BF16", [MAMBA_HEADS], lambda: np.ones(MAMBA_HEADS))
        nano.add_dense(s, f"{m}.norm.weight", "BF16", [D_INNER], lambda: np.ones(D_INNER))
        add_matrix(s, rng, f"{m}.out_proj.weight", H, D_INNER)
    elif kind == "*":
        add_matrix(s, rng, f"{m}.q_proj.weight", HEADS * HEAD_DIM, H)
        add_matrix(s, rng, f"{m}.k_proj.weight", KV_HEADS * HEAD_DIM, H)
        add_matrix(s, rng, f"{m}.v_proj.weight", KV_HEADS * HEAD_DIM, H)
        add_matrix(s, rng, f"{m}.o_proj.weight", H, HEADS * HEAD_DIM)
    elif kind == "E":
        nano.add_dense(s, f"{m}.gate.weight", "BF16", [EXPERTS, H], lambda: nano.router(rng))
        nano.add_dense(s, f"{m}.gate.e_score_correction_bias", "F32", [EXPERTS],
                       lambda: rng.normal(0, 0.05, EXPERTS))
        for e in range(EXPERTS):
            add_matrix(s, rng, f"{m}.experts.{e}.up_proj.weight", EXPERT_WIDTH, H)
            add_matrix(s, rng, f"{m}.experts.{e}.down_proj.weight", H, EXPERT_WIDTH, balanced=True)
        add_matrix(s, rng, f"{m}.shared_experts.up_proj.weight", SHARED_WIDTH, H)
        add_matrix(s, rng, f"{m}.shared_experts.down_proj.weight", H, SHARED_WIDTH, balanced=True)
    else:
        raise ValueError(f"layer kind {kind!r} is not in Nano's pattern")
    return s


def top_shard(rng):
    s = HfShard()
    add_matrix(s, rng, "backbone.embeddings.weight", V, H)
    add_matrix(s, rng, "lm_head.weight", V, H)
    nano.add_dense(s, "backbone.norm_f.weight", "BF16", [H], lambda: np.ones(H))
    return s


def build(out_dir, layers, log=lambda message: None):
    pattern = NANO_PATTERN[:layers]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    makers = [top_shard] + [lambda rng, i=i, k=k: layer_shard(rng, i, k)
                            for i, k in enumerate(pattern)]
    # 0x4846 ("HF") keeps these numbers apart from the quantized checkpoints' (keyed by bits).
    nano.write_shards(out, makers, 0x4846, {"version": RECIPE_VERSION, "format": "hf-bf16"},
                      pattern, config(pattern), log)
    return out


def tensor_span(directory, name):
    """(shard path, byte offset of the tensor's data, header entry) of one tensor."""
    weight_map = json.loads((directory / "model.safetensors.index.json").read_text())["weight_map"]
    shard = directory / weight_map[name]
    start, header = nano.read_header(shard)
    entry = header[name]
    return shard, start + entry["data_offsets"][0], entry


def copy_biases(mlx_dir, hf_dir, log=lambda message: None):
    """Copies every MoE layer's F32 correction bias from mlx_dir into hf_dir's shards in place."""
    pattern = json.loads((hf_dir / "config.json").read_text())["hybrid_override_pattern"]
    for layer, kind in enumerate(pattern):
        if kind != "E":
            continue
        name = f"backbone.layers.{layer}.mixer.gate.e_score_correction_bias"
        values = []
        for directory in (mlx_dir, hf_dir):
            shard, offset, entry = tensor_span(directory, name)
            assert entry["dtype"] == "F32" and entry["shape"] == [EXPERTS], (directory, entry)
            values.append((shard, offset))
        (src, src_offset), (dst, dst_offset) = values
        with open(src, "rb") as f:
            f.seek(src_offset)
            data = f.read(4 * EXPERTS)
        with open(dst, "r+b") as f:
            f.seek(dst_offset)
            f.write(data)
        log(f"layer {layer}: correction bias copied into {dst.name}")


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--layers", type=int, default=8,
                        help=f"the first LAYERS layers of the pattern, 1..{len(NANO_PATTERN)}")
    parser.add_argument("--balance-routers", metavar="TOOL",
                        help="balance the routers on MLX_DIR's hidden states (a dspark_tool_model "
                             "binary) and copy the biases into OUT_DIR; writes nothing else")
    parser.add_argument("--mlx", metavar="MLX_DIR", help="`dspark convert --hf` of OUT_DIR")
    args = parser.parse_args(argv[1:])
    log = lambda message: print(message, flush=True)  # noqa: E731
    out = Path(args.out_dir)
    if args.balance_routers:
        if not args.mlx:
            parser.error("--balance-routers needs --mlx MLX_DIR")
        nano.balance_routers(args.mlx, args.balance_routers, log=log)
        copy_biases(Path(args.mlx), out, log=log)
        record = (Path(args.mlx) / "router_balance.json").read_bytes()
        (out / "router_balance.json").write_bytes(record)
        return 0
    if not 1 <= args.layers <= len(NANO_PATTERN):
        parser.error(f"--layers must be in 1..{len(NANO_PATTERN)}")
    print(build(out, args.layers, log=log))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
