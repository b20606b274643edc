#!/usr/bin/env python3
"""Writes a synthetic Nemotron-3 Nano / Lightning 30B-A3B checkpoint for speed and memory work.

Real shapes (hidden 2688, 64 Mamba heads of 64, 8 groups of 128 states, 32/2 attention heads of
128, 128 experts of 1856 with top-6 and a 3712-wide shared expert, vocab 131072) in the MLX affine
layout (group 64, bf16 scales and biases, 4 or 6 bits) and random weights, for the first LAYERS
layers of the real 52-layer pattern (default 8: MEMEM*EM, about 2.6 GB at 4 bits; `--layers 52`
is the whole model, 17.8 GB at 4 bits and 25.7 GB at 6 bits). One shard per layer plus the
embedding / lm_head shard and a shard index, as mlx-lm writes large checkpoints. Nothing here is
meant to produce sensible text, but the numbers are shaped so that a long decode stays finite and
routes like a trained model (see `router` and `mamba_dt_bias`).

    make_synthetic_nano.py OUT_DIR [LAYERS] [--bits 4|6] [--dspark-head]

Memory stays bounded (one chunk of one tensor at a time). The run is resumable: each shard is
written under a temporary name and renamed when complete, and a shard whose header carries the
same recipe is kept. Never write OUT_DIR into the source tree; ~/.cache/dspark/synthetic/ is the
usual place.
"""

import argparse
import json
import os
import shutil
import struct
import sys
from pathlib import Path

import numpy as np

# The Nemotron-structured tokenizer fixture (8,000 tokens, Nemotron's special ids and template), so
# `dspark generate` runs; ids past its vocabulary decode to nothing.
TOKENIZER = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "nemotron-tiny"

NANO_PATTERN = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"
RECIPE_VERSION = 3
SEED = 1234
H, V = 2688, 131072
MAMBA_HEADS, MAMBA_HEAD_DIM, GROUPS, STATE, KERNEL = 64, 64, 8, 128, 4
HEADS, KV_HEADS, HEAD_DIM = 32, 2, 128
EXPERTS, TOP_K, EXPERT_WIDTH, SHARED_WIDTH = 128, 6, 1856, 3712
GROUP = 64
D_INNER = MAMBA_HEADS * MAMBA_HEAD_DIM
CONV_DIM = D_INNER + 2 * GROUPS * STATE
CHUNK_BYTES = 64 << 20  # the most random data held at once
ITEM_SIZE = {"U32": 4, "BF16": 2, "F32": 4}


def config(pattern, bits):
    quant = {"group_size": GROUP, "bits": bits, "mode": "affine"}
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
        "bos_token_id": 1,
        "eos_token_id": 2,
        "quantization": quant,
        "quantization_config": quant,
    }


def bf16(values):
    bits = np.asarray(values, dtype=np.float32).view(np.uint32)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    return (rounded >> 16).astype(np.uint16)


class Shard:
    """Tensor recipes for one safetensors file; each recipe yields its data in bounded chunks."""

    def __init__(self):
        self.entries = []  # (name, dtype, shape, nbytes, chunks)

    def add(self, name, dtype, shape, chunks):
        size = ITEM_SIZE[dtype] * int(np.prod(shape))
        self.entries.append((name, dtype, list(shape), size, chunks))

    def add_array(self, name, dtype, shape, make):
        self.add(name, dtype, shape, lambda: iter([make()]))

    def header(self, recipe):
        header, offset = {"__metadata__": {"format": "mlx", "dspark_recipe": recipe}}, 0
        for name, dtype, shape, size, _ in self.entries:
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
            offset += size
        blob = json.dumps(header, separators=(",", ":")).encode()
        return blob + b" " * (-len(blob) % 8)

    def file_size(self, recipe):
        return 8 + len(self.header(recipe)) + sum(size for _, _, _, size, _ in self.entries)

    def is_written(self, path, recipe):
        """True when path is a complete shard of this recipe (shards are renamed when complete)."""
        try:
            with open(path, "rb") as f:
                (length,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(length))
        except (OSError, ValueError, struct.error):
            return False
        return (header.get("__metadata__", {}).get("dspark_recipe") == recipe
                and path.stat().st_size == self.file_size(recipe))

    def write(self, path, recipe):
        temp = path.with_name(path.name + ".tmp")
        blob = self.header(recipe)
        with open(temp, "wb") as f:
            f.write(struct.pack("<Q", len(blob)))
            f.write(blob)
            for name, _, _, size, chunks in self.entries:
                written = 0
                for chunk in chunks():
                    chunk = np.ascontiguousarray(chunk)
                    chunk.tofile(f)
                    written += chunk.nbytes
                assert written == size, name
            f.flush()
            os.fsync(f.fileno())
        temp.rename(path)


def random_words(rng, shape):
    """Uniform packed codes, generated CHUNK_BYTES at a time along the leading rows."""
    rows, words = int(np.prod(shape[:-1])), shape[-1]
    step = max(1, CHUNK_BYTES // (4 * words))
    for first in range(0, rows, step):
        yield rng.integers(0, 2**32, (min(step, rows - first), words), dtype=np.uint32)


def balanced_words(rng, shape, bits):
    """Packed codes whose every group dequantizes to weights summing to zero.

    The codes come in blocks of 2n (one word of 8 codes at 4 bits, three words of 16 at 6): the
    second half of a block is the bitwise complement of the first, so code k + n = 2^bits - 1 -
    code k and each block's weights cancel in pairs. A down projection fed relu² activations
    (all ≥ 0, mean > 0) then adds no fixed direction to the residual stream: with uniform codes
    every token's hidden state shares that direction, and the routers downstream all pick the
    same few experts.
    """
    for chunk in random_words(rng, shape):
        if bits == 4:
            half = chunk & 0xFFFF
            yield half | ((~half & 0xFFFF) << 16)
        else:
            blocks = chunk.reshape(chunk.shape[0], -1, 3).astype(np.uint64)
            half = blocks[..., 0] | ((blocks[..., 1] & 0xFFFF) << 32)  # codes 0..7: 48 bits
            rest = ~half & 0xFFFFFFFFFFFF  # codes 8..15
            words = np.stack([half & 0xFFFFFFFF,
                              (half >> 32) | ((rest & 0xFFFF) << 16),
                              rest >> 16], axis=-1)
            yield words.astype(np.uint32).reshape(chunk.shape)


def add_quantized(shard, rng, bits, path, out, cols, experts=None, balanced=False):
    lead = [experts] if experts else []
    words, groups = cols * bits // 32, cols // GROUP
    make = balanced_words if balanced else lambda rng, shape, bits: random_words(rng, shape)
    shard.add(f"{path}.weight", "U32", lead + [out, words],
              lambda: make(rng, lead + [out, words], bits))
    # Codes 0..2^bits-1 spread the weights uniformly over ±amplitude (variance 1/cols · 0.96, so a
    # product keeps its input's scale): scale = 2·amplitude / (2^bits - 1), bias = -amplitude.
    amplitude = 1.7 / np.sqrt(cols)
    levels = 2**bits - 1
    shard.add_array(f"{path}.scales", "BF16", lead + [out, groups],
                    lambda: bf16(np.full(lead + [out, groups], 2 * amplitude / levels)))
    shard.add_array(f"{path}.biases", "BF16", lead + [out, groups],
                    lambda: bf16(np.full(lead + [out, groups], -amplitude)))


def add_dense(shard, name, dtype, shape, make):
    if dtype == "BF16":
        shard.add_array(name, dtype, shape, lambda: bf16(make()))
    else:
        shard.add_array(name, dtype, shape, lambda: make().astype(np.float32))


def mamba_dt_bias(rng):
    """Mamba-2's initialisation: dt log-uniform in [1e-3, 1e-1], dt_bias = softplus⁻¹(dt).

    Small steps make the SSM decay slowly (exp(-dt·A) near 1), as in trained Mamba layers; the
    state still stays bounded because each input enters scaled by dt.
    """
    dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), MAMBA_HEADS))
    return dt + np.log(-np.expm1(-dt))


def router(rng):
    """Router rows with a per-expert norm spread and a centred correction bias.

    A trained router's logits spread over a few units, and its correction bias (set by load
    balancing) is of the order of the score differences it arbitrates. Rows of norm ~2 over unit-RMS
    inputs give logits with a standard deviation of ~2, so the sigmoid scores separate and the
    chosen six change from token to token with the hidden state.
    """
    gain = rng.uniform(1.5, 2.5, [EXPERTS, 1])
    return rng.normal(0, 1, [EXPERTS, H]) * gain / np.sqrt(H)


def layer_shard(rng, bits, index, kind):
    s, p = Shard(), f"backbone.layers.{index}"
    m = f"{p}.mixer"
    add_dense(s, f"{p}.norm.weight", "BF16", [H], lambda: np.ones(H))
    if kind == "M":
        add_quantized(s, rng, bits, f"{m}.in_proj", D_INNER + CONV_DIM + MAMBA_HEADS, H)
        add_quantized(s, rng, bits, f"{m}.out_proj", H, D_INNER)
        add_dense(s, f"{m}.conv1d.weight", "BF16", [CONV_DIM, KERNEL, 1],
                  lambda: rng.normal(0, 0.3, [CONV_DIM, KERNEL, 1]))
        add_dense(s, f"{m}.conv1d.bias", "BF16", [CONV_DIM], lambda: rng.normal(0, 0.1, CONV_DIM))
        add_dense(s, f"{m}.dt_bias", "BF16", [MAMBA_HEADS], lambda: mamba_dt_bias(rng))
        # A = -exp(A_log) uniform in [-16, -1], Mamba-2's initialisation.
        add_dense(s, f"{m}.A_log", "F32", [MAMBA_HEADS],
                  lambda: np.log(rng.uniform(1, 16, MAMBA_HEADS)))
        add_dense(s, f"{m}.D", "BF16", [MAMBA_HEADS], lambda: np.ones(MAMBA_HEADS))
        add_dense(s, f"{m}.norm.weight", "BF16", [D_INNER], lambda: np.ones(D_INNER))
    elif kind == "*":
        add_quantized(s, rng, bits, f"{m}.q_proj", HEADS * HEAD_DIM, H)
        add_quantized(s, rng, bits, f"{m}.k_proj", KV_HEADS * HEAD_DIM, H)
        add_quantized(s, rng, bits, f"{m}.v_proj", KV_HEADS * HEAD_DIM, H)
        add_quantized(s, rng, bits, f"{m}.o_proj", H, HEADS * HEAD_DIM)
    elif kind == "E":
        add_dense(s, f"{m}.gate.weight", "BF16", [EXPERTS, H], lambda: router(rng))
        add_dense(s, f"{m}.gate.e_score_correction_bias", "F32", [EXPERTS],
                  lambda: rng.normal(0, 0.05, EXPERTS))
        add_quantized(s, rng, bits, f"{m}.switch_mlp.fc1", EXPERT_WIDTH, H, EXPERTS)
        add_quantized(s, rng, bits, f"{m}.switch_mlp.fc2", H, EXPERT_WIDTH, EXPERTS, balanced=True)
        add_quantized(s, rng, bits, f"{m}.shared_experts.up_proj", SHARED_WIDTH, H)
        add_quantized(s, rng, bits, f"{m}.shared_experts.down_proj", H, SHARED_WIDTH,
                      balanced=True)
    else:
        raise ValueError(f"layer kind {kind!r} is not in Nano's pattern")
    return s


def top_shard(rng, bits):
    s = Shard()
    add_quantized(s, rng, bits, "backbone.embeddings", V, H)
    add_quantized(s, rng, bits, "lm_head", V, H)
    add_dense(s, "backbone.norm_f.weight", "BF16", [H], lambda: np.ones(H))
    return s


# The DSpark head of Nemotron-3.5-Lightning (docs/speculative.md §11.10): published are the causal
# block of 8 drafting from slot 1, the 1024-token sliding window, per-head attention sinks, Markov
# rank 512, its own embedding and the target's lm_head. Not published here, so assumed: the layer
# count, the attention and MLP widths and the taps below.
HEAD_LAYERS, HEAD_HEADS, HEAD_KV_HEADS, HEAD_HEAD_DIM, HEAD_INTERMEDIATE = 2, 32, 4, 128, 8192
HEAD_TAPS, HEAD_BLOCK, HEAD_WINDOW, HEAD_RANK, HEAD_MASK = [1, 25, 49], 8, 1024, 512, V - 1


def normal_chunks(rng, shape, scale):
    """bf16 Normal(0, scale) values, CHUNK_BYTES of float32 at a time along the leading rows."""
    rows, cols = int(np.prod(shape[:-1])), shape[-1]
    step = max(1, CHUNK_BYTES // (4 * cols))
    for first in range(0, rows, step):
        yield bf16(rng.normal(0, scale, (min(step, rows - first), cols)))


def head_shard(rng):
    s = Shard()

    def matrix(name, out, cols):
        s.add(name, "BF16", [out, cols], lambda: normal_chunks(rng, [out, cols], 1 / np.sqrt(cols)))

    def ones(name, n):
        add_dense(s, name, "BF16", [n], lambda: np.ones(n))

    s.add("embed_tokens.weight", "BF16", [V, H], lambda: normal_chunks(rng, [V, H], 1.0))
    matrix("fc.weight", H, len(HEAD_TAPS) * H)
    ones("hidden_norm.weight", H)
    ones("norm.weight", H)
    q, kv = HEAD_HEADS * HEAD_HEAD_DIM, HEAD_KV_HEADS * HEAD_HEAD_DIM
    for i in range(HEAD_LAYERS):
        p = f"layers.{i}"
        ones(f"{p}.input_layernorm.weight", H)
        ones(f"{p}.post_attention_layernorm.weight", H)
        matrix(f"{p}.self_attn.q_proj.weight", q, H)
        matrix(f"{p}.self_attn.k_proj.weight", kv, H)
        matrix(f"{p}.self_attn.v_proj.weight", kv, H)
        matrix(f"{p}.self_attn.o_proj.weight", H, q)
        ones(f"{p}.self_attn.q_norm.weight", HEAD_HEAD_DIM)
        ones(f"{p}.self_attn.k_norm.weight", HEAD_HEAD_DIM)
        add_dense(s, f"{p}.self_attn.attention_sink_bias", "BF16", [HEAD_HEADS],
                  lambda: rng.normal(0, 1, HEAD_HEADS))
        matrix(f"{p}.mlp.gate_proj.weight", HEAD_INTERMEDIATE, H)
        matrix(f"{p}.mlp.up_proj.weight", HEAD_INTERMEDIATE, H)
        matrix(f"{p}.mlp.down_proj.weight", H, HEAD_INTERMEDIATE)
    s.add("markov_head.markov_w1.weight", "BF16", [V, HEAD_RANK],
          lambda: normal_chunks(rng, [V, HEAD_RANK], 1.0))
    matrix("markov_head.markov_w2.weight", V, HEAD_RANK)
    matrix("confidence_head.proj.weight", 1, H + HEAD_RANK)
    add_dense(s, "confidence_head.proj.bias", "BF16", [1], lambda: np.zeros(1))
    return s


def head_config(target_layers):
    return {
        "architectures": ["Qwen3DSparkModel"],
        "model_type": "qwen3",
        "hidden_size": H,
        "vocab_size": V,
        "num_hidden_layers": HEAD_LAYERS,
        "intermediate_size": HEAD_INTERMEDIATE,
        "num_attention_heads": HEAD_HEADS,
        "num_key_value_heads": HEAD_KV_HEADS,
        "head_dim": HEAD_HEAD_DIM,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "attention_bias": False,
        "block_size": HEAD_BLOCK,
        "mask_token_id": HEAD_MASK,
        "markov_rank": HEAD_RANK,
        "markov_head_type": "vanilla",
        "enable_confidence_head": True,
        "confidence_head_with_markov": True,
        "target_layer_ids": HEAD_TAPS,
        "num_target_layers": target_layers,
        "dflash_query_causal": True,
        "sliding_window": HEAD_WINDOW,
        "attention_sink_bias": True,
        "sample_from_anchor": False,
        "has_lm_head": False,
    }


def build_head(out_dir, target_layers, log=lambda message: None):
    """A random DSpark head for the target written by build(), in bf16 as the published one."""
    if target_layers <= max(HEAD_TAPS):
        raise ValueError(f"the head taps layers {HEAD_TAPS}: the target needs more than "
                         f"{max(HEAD_TAPS)} layers")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shard = head_shard(np.random.default_rng([SEED, 99]))
    recipe = json.dumps({"version": RECIPE_VERSION, "head": HEAD_LAYERS})
    file = out / "model.safetensors"
    if shard.is_written(file, recipe):
        log(f"{file.name}: kept")
    else:
        shard.write(file, recipe)
        log(f"{file.name}: written")
    (out / "config.json").write_text(json.dumps(head_config(target_layers), indent=2) + "\n")
    return out


def write_shards(out, makers, rng_key, recipe_fields, pattern, config_json, log):
    """Shard i = makers[i](rng [SEED, rng_key, i]) into out, kept where its recipe already
    matches (any subset of shards can be rewritten), then the index, config.json and the
    tokenizer; shards of another count are removed."""
    files = [f"model-{i + 1:05d}-of-{len(makers):05d}.safetensors" for i in range(len(makers))]
    for old in list(out.glob("model*.safetensors")) + list(out.glob("model*.safetensors.tmp")):
        if old.name not in files:
            old.unlink()
    weight_map, total = {}, 0
    for i, (make, file) in enumerate(zip(makers, files)):
        shard = make(np.random.default_rng([SEED, rng_key, i]))
        recipe = json.dumps({**recipe_fields, "shard": i,
                             "kind": "top" if i == 0 else pattern[i - 1]})
        if shard.is_written(out / file, recipe):
            log(f"{file}: kept")
        else:
            shard.write(out / file, recipe)
            log(f"{file}: written")
        for name, _, _, size, _ in shard.entries:
            weight_map[name] = file
            total += size
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    (out / "config.json").write_text(json.dumps(config_json, indent=2) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(TOKENIZER / name, out / name)


def build(out_dir, layers, bits=4, log=lambda message: None):
    pattern = NANO_PATTERN[:layers]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    makers = [lambda rng: top_shard(rng, bits)]
    makers += [lambda rng, i=i, k=k: layer_shard(rng, bits, i, k) for i, k in enumerate(pattern)]
    write_shards(out, makers, bits, {"version": RECIPE_VERSION, "bits": bits}, pattern,
                 config(pattern, bits), log)
    (out / "recipe.json").unlink(missing_ok=True)  # version 1's whole-directory stamp
    return out


def read_header(path):
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return 8 + length, json.loads(f.read(length))


def balanced_bias(logits, bias, steps=400):
    """The correction bias that spreads top-k selection evenly over the experts.

    DeepSeek-V3's auxiliary-loss-free balancing, which the Nemotron router's correction bias comes
    from: move each expert's bias against its load, here with a step that shrinks, on fixed router
    logits [tokens, experts].
    """
    scores = 1 / (1 + np.exp(-logits))
    bias = bias.astype(np.float64)
    for step in range(steps):
        chosen = np.argpartition(-(scores + bias), TOP_K, axis=1)[:, :TOP_K]
        load = np.bincount(chosen.ravel(), minlength=EXPERTS)
        rate = 0.02 * (1 - step / steps) + 1e-4
        bias += rate * np.sign(load.mean() - load)
    return bias.astype(np.float32)


def routing_spread(logits, bias):
    """(experts chosen at least once, the busiest expert's share of all choices)."""
    scores = 1 / (1 + np.exp(-logits))
    chosen = np.argpartition(-(scores + bias), TOP_K, axis=1)[:, :TOP_K]
    load = np.bincount(chosen.ravel(), minlength=EXPERTS)
    return int((load > 0).sum()), float(load.max() / load.sum())


def balance_routers(out_dir, tool, tokens=512, log=lambda message: None):
    """Sets each MoE layer's correction bias so that this checkpoint's own hidden states spread.

    Random weights give every token's hidden state a large shared component, and a random router
    then sends most tokens to the same few experts in every layer (a trained router's correction
    bias is tuned against exactly that). The router inputs of `tokens` random tokens are read from
    dspark (`dspark_tool_model`, the taps before each MoE layer), the bias is balanced on them
    layer by layer, and patched into the shards in place (same size, so the shards' recipes still
    hold and a rerun keeps them). A later layer's inputs move slightly once earlier layers route
    differently; one pass is enough for the spread.
    """
    import subprocess
    import tempfile

    out = Path(out_dir)
    cfg = json.loads((out / "config.json").read_text())
    pattern = cfg["hybrid_override_pattern"]
    moe = [i for i, k in enumerate(pattern) if k == "E"]
    weight_map = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    ids = np.random.default_rng([SEED, 7]).integers(0, V, tokens).tolist()
    with tempfile.TemporaryDirectory() as work:
        script = {"steps": [{"op": "forward", "tokens": ids, "logit_rows": [tokens - 1],
                             "tap_layers": [i - 1 for i in moe]}]}
        (Path(work) / "script.json").write_text(json.dumps(script))
        subprocess.run([tool, str(out), str(Path(work) / "script.json"), work], check=True,
                       stdout=subprocess.DEVNULL)
        taps = np.load(Path(work) / "step0_taps.npy")  # [tokens, layers, hidden]
    record = {"tokens": tokens, "layers": {}}
    for column, layer in enumerate(moe):
        m = f"backbone.layers.{layer}.mixer.gate"
        shard = out / weight_map[f"{m}.weight"]
        start, header = read_header(shard)
        gate_entry, bias_entry = header[f"{m}.weight"], header[f"{m}.e_score_correction_bias"]
        assert gate_entry["dtype"] == "BF16" and bias_entry["dtype"] == "F32"
        with open(shard, "r+b") as f:
            f.seek(start + gate_entry["data_offsets"][0])
            raw = np.frombuffer(f.read(EXPERTS * H * 2), dtype=np.uint16)
            gate = (raw.astype(np.uint32) << 16).view(np.float32).reshape(EXPERTS, H)
            f.seek(start + bias_entry["data_offsets"][0])
            bias = np.frombuffer(f.read(EXPERTS * 4), dtype=np.float32)
            h = taps[:, column, :].astype(np.float64)
            xn = h / np.sqrt(np.mean(h * h, axis=1, keepdims=True) + cfg["layer_norm_epsilon"])
            logits = xn @ gate.T.astype(np.float64)
            balanced = balanced_bias(logits, bias)
            f.seek(start + bias_entry["data_offsets"][0])
            f.write(balanced.tobytes())
        spread = {name: routing_spread(logits, b) for name, b in (("before", bias),
                                                                   ("after", balanced))}
        record["layers"][layer] = spread
        log(f"layer {layer}: experts used {spread['before'][0]} -> {spread['after'][0]}, busiest "
            f"expert {100 * spread['before'][1]:.1f}% -> {100 * spread['after'][1]:.1f}% of choices")
    (out / "router_balance.json").write_text(json.dumps(record, indent=2) + "\n")


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("layers", nargs="?", type=int, default=8,
                        help=f"the first LAYERS layers of the pattern, 1..{len(NANO_PATTERN)}")
    parser.add_argument("--layers", dest="layers_flag", type=int, help="same as LAYERS")
    parser.add_argument("--bits", type=int, choices=[4, 6], default=4)
    parser.add_argument("--balance-routers", metavar="TOOL",
                        help="then balance every MoE layer's correction bias on the checkpoint's "
                             "own hidden states, read with this dspark_tool_model binary")
    parser.add_argument("--dspark-head", action="store_true",
                        help="also write a random DSpark head at the Nemotron head's shapes to "
                             "OUT_DIR-DSpark (pass it with --drafter: discovery beside the model "
                             "drops a -4bit suffix from the model's name)")
    args = parser.parse_args(argv[1:])
    layers = args.layers_flag if args.layers_flag is not None else args.layers
    if not 1 <= layers <= len(NANO_PATTERN):
        parser.error(f"LAYERS must be in 1..{len(NANO_PATTERN)}")
    if args.dspark_head and layers <= max(HEAD_TAPS):
        parser.error(f"--dspark-head taps layers {HEAD_TAPS}: LAYERS must exceed {max(HEAD_TAPS)}")
    log = lambda message: print(message, flush=True)  # noqa: E731
    print(build(args.out_dir, layers, args.bits, log=log))
    if args.balance_routers:
        balance_routers(args.out_dir, args.balance_routers, log=log)
    if args.dspark_head:
        print(build_head(f"{args.out_dir.rstrip('/')}-DSpark", layers, log=log))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
