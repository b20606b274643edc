#!/usr/bin/env python3
"""Creates tiny random models with mlx-lm itself, for the model oracle tests.

Each model is built from mlx-lm's own model classes (nemotron_h, llama, qwen3), given random
weights from a fixed seed, optionally quantized with mlx-lm's quantize_model (affine, group 64,
4/6/8 bits), and saved as an MLX checkpoint: config.json + model.safetensors. Everything stays
float32 so that mlx-lm on the CPU is an accurate oracle (bf16 on the CPU accumulates quantized
products in bf16).

    make_tiny_models.py OUT_DIR [NAME ...]

NAME is a base model (float32), NAME_q4/_q6/_q8 (quantized) or NAME_hf (bf16, Hugging Face layout).
A model whose recipe has not changed since it was written is not rebuilt (OUT_DIR/NAME/recipe.json
records the recipe).
"""

import copy
import importlib
import json
import math
import os
import sys
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.utils import quantize_model

RECIPE_VERSION = 1
VOCAB = 512

NEMOTRON_BASE = {
    "model_type": "nemotron_h",
    "vocab_size": VOCAB,
    "hidden_size": 128,
    "max_position_embeddings": 4096,
    "attention_bias": False,
    "mamba_proj_bias": False,
    "mlp_bias": False,
    "use_bias": False,
    "use_conv_bias": True,
    "layer_norm_epsilon": 1e-5,
    "tie_word_embeddings": False,
}

# Patterns start with M, * and E; each has every layer kind somewhere across the set, including a
# dense '-' layer, grouped routing, no shared expert, a latent MoE and a dt clamp.
BASE_MODELS = {
    "nemotron_m": {
        **NEMOTRON_BASE,
        "hybrid_override_pattern": "M*EM-E",
        "intermediate_size": 192,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "mamba_num_heads": 8,
        "mamba_head_dim": 16,
        "ssm_state_size": 16,
        "n_groups": 2,
        "conv_kernel": 4,
        "chunk_size": 16,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "moe_intermediate_size": 64,
        "n_shared_experts": 1,
        "moe_shared_expert_intermediate_size": 128,
    },
    "nemotron_attn": {
        **NEMOTRON_BASE,
        "hybrid_override_pattern": "*MEM*E",
        "intermediate_size": 128,
        "num_attention_heads": 8,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "mamba_num_heads": 16,
        "mamba_head_dim": 8,
        "ssm_state_size": 32,
        "n_groups": 4,
        "conv_kernel": 3,
        "n_routed_experts": 16,
        "num_experts_per_tok": 4,
        "n_group": 4,
        "topk_group": 2,
        "norm_topk_prob": False,
        "routed_scaling_factor": 1.5,
        "moe_intermediate_size": 128,
        "n_shared_experts": 1,
        "moe_shared_expert_intermediate_size": 64,
        "time_step_limit": [0.01, 0.6],
    },
    "nemotron_moe": {
        **NEMOTRON_BASE,
        "hybrid_override_pattern": "EM*EMM",
        "intermediate_size": 128,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "mamba_num_heads": 4,
        "mamba_head_dim": 32,
        "ssm_state_size": 64,
        "n_groups": 1,
        "conv_kernel": 4,
        "n_routed_experts": 4,
        "num_experts_per_tok": 1,
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.0,
        "moe_intermediate_size": 64,
        "moe_latent_size": 64,
        "tie_word_embeddings": True,
    },
    "llama_tied": {
        "model_type": "llama",
        "vocab_size": VOCAB,
        "hidden_size": 128,
        "num_hidden_layers": 3,
        "intermediate_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
    },
    "llama3_scaled": {
        "model_type": "llama",
        "vocab_size": VOCAB,
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "intermediate_size": 192,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
    },
    "qwen3_tied": {
        "model_type": "qwen3",
        "vocab_size": VOCAB,
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "intermediate_size": 192,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
    },
    "qwen3_yarn": {
        "model_type": "qwen3",
        "vocab_size": VOCAB,
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 32,
        },
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
    },
}

QUANT_BITS = (4, 6, 8)
# Saved the way Hugging Face checkpoints are: bf16, experts.{e}.up_proj/down_proj per expert,
# conv1d weight [C, 1, K]; mlx-lm's sanitize turns them back into its own layout on load.
HF_LAYOUT = ("nemotron_m", "nemotron_attn")


def model_names():
    names = []
    for base in BASE_MODELS:
        names.append(base)
        names.extend(f"{base}_q{bits}" for bits in QUANT_BITS)
    names.extend(f"{base}_hf" for base in HF_LAYOUT)
    return names


def recipe(name):
    hf = name.endswith("_hf")
    base, _, quant = name.removesuffix("_hf").partition("_q")
    if (
        base not in BASE_MODELS
        or (quant and int(quant) not in QUANT_BITS)
        or (hf and base not in HF_LAYOUT)
    ):
        raise KeyError(f"unknown tiny model {name!r}; known: {', '.join(model_names())}")
    return {
        "version": RECIPE_VERSION,
        "base": base,
        "bits": int(quant) if quant else None,
        "hf_layout": hf,
        "config": BASE_MODELS[base],
        "seed": sorted(BASE_MODELS).index(base) + 1,
    }


def to_hf_layout(weights):
    """MLX nemotron_h names and layouts -> the Hugging Face release's, in bf16."""
    out = {}
    for name, value in weights.items():
        if ".switch_mlp.fc" in name:
            prefix, rest = name.split(".switch_mlp.")
            projection = "up_proj" if rest.startswith("fc1") else "down_proj"
            for e in range(value.shape[0]):
                out[f"{prefix}.experts.{e}.{projection}.weight"] = value[e]
            continue
        if name.endswith("conv1d.weight"):
            value = value.moveaxis(2, 1)
        out[name] = value
    # mlx-lm's conversion keeps these two in their source dtype; everything else is bf16.
    return {
        k: v if ("A_log" in k or "e_score_correction_bias" in k) else v.astype(mx.bfloat16)
        for k, v in out.items()
    }


def randomize(model, seed):
    """Gives every parameter a random value of a sensible scale for its role."""
    mx.random.seed(seed)
    params = []
    for name, p in tree_flatten(model.parameters()):
        shape = p.shape
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "A_log":
            value = mx.log(mx.random.uniform(0.5, 8.0, shape))
        elif leaf == "dt_bias":
            value = mx.random.normal(shape) * 0.5 - 1.0
        elif leaf == "D":
            value = mx.random.normal(shape)
        elif "conv1d.weight" in name:
            value = mx.random.normal(shape) * 0.5
        elif len(shape) == 1 and "norm" in name:
            value = 1.0 + 0.2 * mx.random.normal(shape)
        elif len(shape) == 1:
            value = mx.random.normal(shape) * 0.2
        else:
            value = mx.random.normal(shape) / math.sqrt(shape[-1])
        params.append((name, value.astype(mx.float32)))
    model.update(tree_unflatten(params))
    mx.eval(model.parameters())


def build(name, out_dir):
    r = recipe(name)
    target = Path(out_dir) / name
    stamp = target / "recipe.json"
    if stamp.exists() and json.loads(stamp.read_text()) == r:
        return target
    config = copy.deepcopy(r["config"])
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    args = module.ModelArgs.from_dict(config)
    model = module.Model(args)
    randomize(model, r["seed"])
    if r["bits"] is not None:
        model, config = quantize_model(model, config, group_size=64, bits=r["bits"])
    weights = dict(tree_flatten(model.parameters()))
    if r["hf_layout"]:
        weights = to_hf_layout(weights)
        config["torch_dtype"] = "bfloat16"
    target.mkdir(parents=True, exist_ok=True)
    # Each file appears whole (written aside, then renamed), the recipe stamp last, so that a
    # concurrent reader or builder never sees a half-written model.
    partial = f".partial-{os.getpid()}"
    written = target / f"model{partial}.safetensors"
    mx.save_safetensors(str(written), weights, metadata={"format": "mlx"})
    os.replace(written, target / "model.safetensors")
    files = ((target / "config.json", json.dumps(config, indent=2) + "\n"), (stamp, json.dumps(r)))
    for path, text in files:
        Path(f"{path}{partial}").write_text(text)
        os.replace(f"{path}{partial}", path)
    return target


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    names = argv[2:] or model_names()
    for name in names:
        print(build(name, argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
