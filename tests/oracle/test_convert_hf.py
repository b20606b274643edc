"""Hugging Face -> MLX quantized conversion, checked against mlx-lm's own converter.

Tiny random models are built with mlx-lm's model classes (nemotron_h, llama, qwen2, qwen3) and
written in Hugging Face layout ("un-sanitized": per-expert up/down projections, conv1d as
[C, 1, K], an mtp.* tensor, rotary inv_freq, a tied lm_head, F32 routers and A_log next to BF16
weights). Both `mlx_lm.convert(quantize=True)` and dspark_tool_hfconvert convert them; the outputs
must hold the same tensors (names, dtypes, shapes, bytes), the same shard index and the same
config.json. Also checked: a module skipped because its input size is not a group multiple,
sharding against mlx-lm's make_shards, the `dspark convert --hf` command line, and refusals.
"""

import importlib
import json
import struct
import subprocess

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from conftest import BUILD_DIR, tool

NEMOTRON = {
    "architectures": ["NemotronHForCausalLM"],
    "model_type": "nemotron_h",
    "vocab_size": 256,
    "hidden_size": 128,
    "hybrid_override_pattern": "M*E-ME",
    "intermediate_size": 160,  # the dense '-' layer: 160 % 64 != 0
    "max_position_embeddings": 1024,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "attention_bias": False,
    "mamba_num_heads": 4,
    "mamba_head_dim": 32,
    "mamba_proj_bias": False,
    "ssm_state_size": 16,
    "n_groups": 2,
    "conv_kernel": 4,
    "use_conv_bias": True,
    "use_bias": False,
    "mlp_bias": False,
    "layer_norm_epsilon": 1e-5,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "moe_intermediate_size": 96,  # switch_mlp.fc2 input: quantized at group 32, not 64 / 128
    "n_shared_experts": 1,
    "moe_shared_expert_intermediate_size": 64,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "_name_or_path": "tiny/nemotron",
}

# The newer list spelling of the layer kinds, a latent MoE without shared expert, biases on the
# projections and no conv bias.
NEMOTRON_LATENT = {
    **{k: v for k, v in NEMOTRON.items()
       if k not in ("hybrid_override_pattern", "n_shared_experts")},
    "layers_block_type": ["mamba", "moe", "attention"],
    "moe_latent_size": 64,
    "attention_bias": True,
    "mamba_proj_bias": True,
    "use_conv_bias": False,
}

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 256,
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
    "attention_bias": True,
    "torch_dtype": "bfloat16",
}

QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 256,
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "intermediate_size": 192,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}

QWEN2 = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "vocab_size": 256,
    "hidden_size": 128,
    "num_hidden_layers": 1,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

# Kept in F32 in the HF files, as NVIDIA's releases do for these.
F32_IN_HF = ("gate.weight", "e_score_correction_bias", "A_log", "rotary_emb.inv_freq")


def mlx_parameters(config, seed):
    """Random parameters of mlx-lm's own model for `config`, by MLX name."""
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model = module.Model(module.ModelArgs.from_dict(config))
    rng = np.random.default_rng(seed)
    params = {}
    for name, value in tree_flatten(model.parameters()):
        scale = 1.0 if name.endswith(("norm.weight", "norm_f.weight", ".D")) else 0.08
        data = rng.standard_normal(value.shape).astype(np.float32) * scale
        if name.endswith("norm.weight") or name.endswith("norm_f.weight"):
            data += 1.0
        params[name] = data
    return params


def to_hf_layout(config, params):
    """Undo mlx-lm's sanitize: the tensors a Hugging Face checkpoint holds."""
    hf = {}
    for name, value in params.items():
        if ".switch_mlp." in name:
            prefix, rest = name.split(".switch_mlp.")
            projection = {"fc1.weight": "up_proj", "fc2.weight": "down_proj"}[rest]
            for expert in range(value.shape[0]):
                hf[f"{prefix}.experts.{expert}.{projection}.weight"] = value[expert]
        elif name.endswith("conv1d.weight"):
            hf[name] = np.ascontiguousarray(value.transpose(0, 2, 1))  # [C, K, 1] -> [C, 1, K]
        else:
            hf[name] = value
    rng = np.random.default_rng(7)
    if config["model_type"] == "nemotron_h":
        hf["mtp.layers.0.eh_proj.weight"] = rng.standard_normal((8, 16)).astype(np.float32)
    else:
        if config["model_type"] != "qwen3":  # mlx-lm drops it for llama and qwen2 only
            hf["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.arange(8, dtype=np.float32)
        if config.get("tie_word_embeddings", True):
            hf["lm_head.weight"] = hf["model.embed_tokens.weight"].copy()
    return hf


def hf_dtype(name, f32_names):
    return mx.float32 if any(part in name for part in f32_names) else mx.bfloat16


def write_tokenizer(directory):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "hello": 3, "world": 4}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>"}))


def make_hf_checkpoint(directory, config, seed, shards=1, f32_names=F32_IN_HF, hf_config=None):
    directory.mkdir(parents=True)
    tensors = to_hf_layout(config, mlx_parameters(config, seed))
    arrays = {name: mx.array(value).astype(hf_dtype(name, f32_names))
              for name, value in tensors.items()}
    names = sorted(arrays)
    if shards == 1:
        mx.save_safetensors(str(directory / "model.safetensors"), arrays, metadata={"format": "pt"})
    else:
        weight_map = {}
        for shard in range(shards):
            file = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
            part = {name: arrays[name] for name in names[shard::shards]}
            mx.save_safetensors(str(directory / file), part, metadata={"format": "pt"})
            weight_map.update({name: file for name in part})
        (directory / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    (directory / "config.json").write_text(json.dumps(hf_config or config, indent=2))
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 4]}))
    (directory / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    write_tokenizer(directory)
    return directory


def read_safetensors(path):
    """name -> (dtype, shape, raw bytes), read straight from the file."""
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    header.pop("__metadata__", None)
    base = 8 + length
    return {name: (entry["dtype"], tuple(entry["shape"]),
                   data[base + entry["data_offsets"][0]:base + entry["data_offsets"][1]])
            for name, entry in header.items()}


def read_model(directory):
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    tensors = {}
    for file in sorted(set(index["weight_map"].values())):
        tensors.update(read_safetensors(directory / file))
    config = json.loads((directory / "config.json").read_text())
    return tensors, index, config


def mlx_lm_convert(hf_dir, out_dir, bits, group, dtype=None):
    from mlx_lm.convert import convert

    convert(hf_path=str(hf_dir), mlx_path=str(out_dir), quantize=True, q_bits=bits,
            q_group_size=group, dtype=dtype)
    return out_dir


def dspark_convert(hf_dir, out_dir, bits, group, *extra):
    result = subprocess.run([tool("hfconvert"), str(hf_dir), str(out_dir), f"bits={bits}",
                             f"group={group}", *extra], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def assert_same_model(ours_dir, theirs_dir):
    ours, our_index, our_config = read_model(ours_dir)
    theirs, their_index, their_config = read_model(theirs_dir)
    assert sorted(ours) == sorted(theirs)
    for name, (dtype, shape, data) in theirs.items():
        assert ours[name][0] == dtype, name
        assert ours[name][1] == shape, name
        assert ours[name][2] == data, f"{name}: bytes differ"
    assert our_index == their_index
    assert our_config == their_config
    # mlx-lm copies generation_config.json; the tokenizer files it re-serializes with transformers.
    generation = "generation_config.json"
    assert (ours_dir / generation).exists() == (theirs_dir / generation).exists()
    if (theirs_dir / generation).exists():
        assert (ours_dir / generation).read_bytes() == (theirs_dir / generation).read_bytes()
    return ours, our_config


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {
        "nemotron_h": make_hf_checkpoint(root / "nemotron_h", NEMOTRON, 1),
        "nemotron_latent": make_hf_checkpoint(root / "nemotron_latent", NEMOTRON_LATENT, 2),
        # F32 o_proj weights: cast to BF16 first, then quantized, as mlx-lm does.
        "llama": make_hf_checkpoint(root / "llama", LLAMA, 3, shards=2,
                                    f32_names=F32_IN_HF + ("o_proj",)),
        "qwen3": make_hf_checkpoint(root / "qwen3", QWEN3, 4),
        "qwen2": make_hf_checkpoint(root / "qwen2", QWEN2, 5),
    }


CASES = [
    ("nemotron_h", 4, 64),
    ("nemotron_h", 6, 32),
    ("nemotron_h", 8, 128),
    ("nemotron_h", 3, 64),
    ("nemotron_latent", 5, 32),
    ("nemotron_latent", 2, 64),
    ("llama", 4, 64),
    ("llama", 8, 32),
    ("llama", 6, 128),
    ("qwen3", 4, 64),
    ("qwen3", 6, 128),
    ("qwen3", 8, 32),
    ("qwen2", 4, 32),
]


@pytest.mark.parametrize("name,bits,group", CASES)
def test_matches_mlx_lm(checkpoints, tmp_path, name, bits, group):
    theirs = mlx_lm_convert(checkpoints[name], tmp_path / "mlx_lm", bits, group)
    summary = dspark_convert(checkpoints[name], tmp_path / "dspark", bits, group)
    tensors, config = assert_same_model(tmp_path / "dspark", theirs)
    assert config["quantization"] == {"group_size": group, "bits": bits, "mode": "affine"}
    assert config["eos_token_id"] == [2, 4]
    assert "_name_or_path" not in config
    assert summary["architecture"] == config["model_type"]
    assert summary["tensors"] == len(tensors)
    assert summary["quantized_modules"] == sum(n.endswith(".scales") for n in tensors)
    assert not (tmp_path / "dspark.partial").exists()
    for file in ("tokenizer.json", "tokenizer_config.json", "generation_config.json",
                 "chat_template.jinja"):
        assert (tmp_path / "dspark" / file).read_bytes() == (checkpoints[name] / file).read_bytes()


def test_nemotron_modules_left_unquantized(checkpoints, tmp_path):
    """Group 64: the expert fc2 (input 96) and the dense down_proj (input 160) stay BF16, as do
    the router, conv1d, A_log, D, dt_bias and the norms; the F32 router weight is cast to BF16
    while the F32 e_score_correction_bias and A_log keep their dtype."""
    dspark_convert(checkpoints["nemotron_h"], tmp_path / "out", 4, 64)
    tensors, _, _ = read_model(tmp_path / "out")
    mixer = "backbone.layers.2.mixer"
    assert tensors[f"{mixer}.switch_mlp.fc2.weight"][:2] == ("BF16", (4, 128, 96))
    assert f"{mixer}.switch_mlp.fc2.scales" not in tensors
    assert tensors[f"{mixer}.switch_mlp.fc1.weight"][:2] == ("U32", (4, 96, 16))
    assert tensors[f"{mixer}.switch_mlp.fc1.scales"][:2] == ("BF16", (4, 96, 2))
    assert tensors["backbone.layers.3.mixer.down_proj.weight"][:2] == ("BF16", (128, 160))
    assert tensors[f"{mixer}.gate.weight"][:2] == ("BF16", (4, 128))
    assert tensors[f"{mixer}.gate.e_score_correction_bias"][0] == "F32"
    assert tensors["backbone.layers.0.mixer.A_log"][0] == "F32"
    assert tensors["backbone.layers.0.mixer.conv1d.weight"][:2] == ("BF16", (192, 4, 1))
    for kept in ("D", "dt_bias", "norm.weight", "conv1d.bias", "conv1d.weight"):
        assert tensors[f"backbone.layers.0.mixer.{kept}"][0] == "BF16", kept
    scaled = {name.removesuffix(".scales") for name in tensors if name.endswith(".scales")}
    assert not any(name.endswith(("gate", "conv1d", "norm", "norm_f")) for name in scaled)
    assert "backbone.embeddings" in scaled and "lm_head" in scaled
    assert not any(name.startswith("mtp.") for name in tensors)
    assert not any(".experts." in name for name in tensors)


@pytest.mark.parametrize("dtype,stored", [("float16", "F16"), ("float32", "F32")])
def test_dtype_option_matches_mlx_lm(checkpoints, tmp_path, dtype, stored):
    theirs = mlx_lm_convert(checkpoints["nemotron_h"], tmp_path / "mlx_lm", 4, 32, dtype)
    dspark_convert(checkpoints["nemotron_h"], tmp_path / "dspark", 4, 32, f"dtype={dtype}")
    tensors, _ = assert_same_model(tmp_path / "dspark", theirs)
    assert tensors["backbone.embeddings.scales"][0] == stored
    assert tensors["backbone.layers.2.mixer.gate.weight"][0] == stored
    assert tensors["backbone.layers.0.mixer.A_log"][0] == "F32"


def test_without_torch_dtype_tensors_keep_their_dtype(tmp_path):
    """mlx-lm casts only to config.json's torch_dtype; newer configs name it "dtype", which it
    does not read, so F32 tensors stay F32 (and an F32 Linear gets F32 scales)."""
    config = {k: v for k, v in LLAMA.items() if k != "torch_dtype"}
    config["dtype"] = "bfloat16"
    hf = make_hf_checkpoint(tmp_path / "hf", LLAMA, 9, hf_config=config,
                            f32_names=("input_layernorm", "mlp.up_proj", "inv_freq"))
    theirs = mlx_lm_convert(hf, tmp_path / "mlx_lm", 4, 64)
    dspark_convert(hf, tmp_path / "dspark", 4, 64)
    tensors, _ = assert_same_model(tmp_path / "dspark", theirs)
    assert tensors["model.layers.0.input_layernorm.weight"][0] == "F32"
    assert tensors["model.layers.0.mlp.up_proj.scales"][0] == "F32"
    assert tensors["model.layers.0.mlp.gate_proj.scales"][0] == "BF16"


def test_shards_split_like_mlx_lm(checkpoints, tmp_path, monkeypatch):
    """mlx-lm cuts shards at 5 GiB. Scaling every tensor's size by 2^20 inside its own
    make_shards gives the split it would make at a 5 KiB limit; ours must match it."""
    import mlx_lm.utils as utils

    original = utils.make_shards
    scale = 1 << 20

    class Scaled:
        def __init__(self, array):
            self.array = array
            self.nbytes = array.nbytes * scale

    def scaled_make_shards(weights, max_file_size_gb=utils.MAX_FILE_SIZE_GB):
        shards = original({k: Scaled(v) for k, v in weights.items()}, max_file_size_gb)
        return [{k: v.array for k, v in shard.items()} for shard in shards]

    monkeypatch.setattr(utils, "make_shards", scaled_make_shards)
    theirs = mlx_lm_convert(checkpoints["nemotron_h"], tmp_path / "mlx_lm", 4, 64)
    limit = (utils.MAX_FILE_SIZE_GB << 30) // scale
    summary = dspark_convert(checkpoints["nemotron_h"], tmp_path / "dspark", 4, 64,
                             f"max_shard_bytes={limit}")
    assert summary["shards"] > 3
    assert_same_model(tmp_path / "dspark", theirs)
    files = sorted(p.name for p in (tmp_path / "dspark").glob("model*.safetensors"))
    assert files == sorted(p.name for p in theirs.glob("model*.safetensors"))
    assert files[0] == f"model-00001-of-{summary['shards']:05d}.safetensors"


def test_command_line(checkpoints, tmp_path):
    dspark = BUILD_DIR / "dspark"
    if not dspark.exists():
        pytest.fail(f"{dspark} is not built")
    out = tmp_path / "cli"
    result = subprocess.run([str(dspark), "convert", "--hf", str(checkpoints["qwen3"]),
                             "--q-bits", "8", "--q-group-size", "32", "-o", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "qwen3" in result.stdout
    dspark_convert(checkpoints["qwen3"], tmp_path / "tool", 8, 32)
    assert read_model(out) == read_model(tmp_path / "tool")
    both = subprocess.run([str(dspark), "convert", "--hf", str(checkpoints["qwen3"]), "--gguf",
                           str(checkpoints["qwen3"] / "config.json")], capture_output=True,
                          text=True)
    assert both.returncode != 0 and "excludes" in both.stderr


def refusal(hf_dir, out_dir, *args):
    result = subprocess.run([tool("hfconvert"), str(hf_dir), str(out_dir), *args],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stdout
    assert not out_dir.exists()
    return result.stderr


def test_refusals(checkpoints, tmp_path):
    qwen3 = checkpoints["qwen3"]
    assert "7 bits" in refusal(qwen3, tmp_path / "a", "bits=7")
    assert "group size 48" in refusal(qwen3, tmp_path / "b", "group=48")
    assert "float8" in refusal(qwen3, tmp_path / "c", "dtype=float8")

    def variant(name, edit_config=None, edit_tensors=None):
        directory = tmp_path / name
        directory.mkdir()
        config = json.loads((qwen3 / "config.json").read_text())
        if edit_config:
            edit_config(config)
        (directory / "config.json").write_text(json.dumps(config))
        tensors = mx.load(str(qwen3 / "model.safetensors"))
        if edit_tensors:
            edit_tensors(tensors)
        mx.save_safetensors(str(directory / "model.safetensors"), tensors,
                            metadata={"format": "pt"})
        return directory

    message = refusal(variant("gpt2", lambda c: c.update(model_type="gpt2")), tmp_path / "d")
    assert "model_type 'gpt2'" in message and "nemotron_h, llama, qwen2, qwen3" in message
    message = refusal(variant("missing", edit_tensors=lambda t: t.pop("model.norm.weight")),
                      tmp_path / "e")
    assert "missing tensor 'model.norm.weight'" in message
    message = refusal(variant("extra", edit_tensors=lambda t: t.update(
        {"model.layers.0.mlp.extra.weight": mx.zeros((2, 2))})), tmp_path / "f")
    assert "model.layers.0.mlp.extra.weight" in message
    message = refusal(variant("shape", edit_tensors=lambda t: t.update(
        {"model.norm.weight": mx.zeros((3,))})), tmp_path / "g")
    assert "model.norm.weight" in message and "[3]" in message and "[128]" in message
    message = refusal(variant("quantized", lambda c: c.update(
        quantization={"group_size": 64, "bits": 4})), tmp_path / "h")
    assert "already quantized" in message
    message = refusal(variant("no_key", lambda c: c.pop("head_dim")), tmp_path / "i")
    assert "head_dim" in message
    (tmp_path / "exists").mkdir()
    result = subprocess.run([tool("hfconvert"), str(qwen3), str(tmp_path / "exists")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "already exists" in result.stderr
    assert list((tmp_path / "exists").iterdir()) == []
