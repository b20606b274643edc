"""GGUF -> MLX conversion, checked against independent readers:
- every converted weight, dequantized by MLX (mx.dequantize), equals the GGUF tensor dequantized by
  llama.cpp's own `gguf` Python package, bit for bit (Q4_0 / Q4_1 / Q8_0 map without loss; llama
  q/k rows un-permuted back to the Hugging Face order);
- the written tokenizer.json, loaded by HF `tokenizers`, encodes like the model's original
  tokenizer.json (fixture) and like llama.cpp's tokenizer on the GGUF;
- unsupported tensor types are refused with a message listing the supported ones."""
import json
import subprocess

import gguf
import mlx.core as mx
import numpy as np
from tokenizers import Tokenizer

from conftest import PUBLIC_FIXTURES, SMOLLM2_GGUF, tool


SAMPLE_TEXTS = [
    "Hello, world! How are you today?",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "12345 + 67890 = 80235, and 3.14159 is pi.",
    "   leading spaces and\ttabs\n\nand newlines  ",
    "Ünïcödé: naïve café, 日本語のテキスト, Ελληνικά, русский, emoji 🚀🔥👍🏽",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "It's we'll they've I'm you'd she's",
    "",
]



def hf_name(gguf_name: str) -> str:
    top = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
    layer = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj",
             "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    stem = gguf_name.removesuffix(".weight")
    if stem in top:
        return top[stem]
    _, index, part = stem.split(".", 2)
    return f"model.layers.{index}.{layer[part]}"


def hf_row_order(rows: int, heads: int) -> np.ndarray:
    """For each Hugging Face row, the GGUF row holding it (convert_hf_to_gguf permutes llama q/k)."""
    head_dim = rows // heads
    return (np.arange(rows).reshape(heads, head_dim // 2, 2).transpose(0, 2, 1).reshape(rows))


def test_weights_dequantize_identically(smollm2):
    reader = gguf.GGUFReader(str(SMOLLM2_GGUF))
    heads = int(reader.fields["llama.attention.head_count"].parts[-1][0])
    kv_heads = int(reader.fields["llama.attention.head_count_kv"].parts[-1][0])
    weights = mx.load(str(smollm2 / "model.safetensors"))
    config = json.loads((smollm2 / "config.json").read_text())
    quant = config["quantization"]
    seen_types = set()
    for tensor in reader.tensors:
        expected = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        expected = expected.reshape([int(d) for d in reversed(tensor.shape)])
        if tensor.name.endswith(("attn_q.weight", "attn_k.weight")):
            n = heads if "attn_q" in tensor.name else kv_heads
            expected = expected[hf_row_order(expected.shape[0], n)]
        module = hf_name(tensor.name)
        seen_types.add(tensor.tensor_type.name)
        if f"{module}.scales" in weights:
            settings = quant.get(module, quant)
            # MLX dequantizes into the scales' dtype; f16 -> f32 is exact and keeps full precision.
            got = mx.dequantize(weights[f"{module}.weight"],
                                weights[f"{module}.scales"].astype(mx.float32),
                                weights[f"{module}.biases"].astype(mx.float32),
                                group_size=settings["group_size"],
                                bits=settings["bits"])
        else:
            got = weights[f"{module}.weight"]
        got = np.array(got.astype(mx.float32))
        assert got.shape == expected.shape, tensor.name
        assert np.array_equal(got, expected), f"{tensor.name}: max diff {np.abs(got - expected).max()}"
    assert {"Q4_1", "Q8_0", "F32"} <= seen_types


def test_tokenizer_matches_original_and_llama_cpp(smollm2):
    from llama_cpp import Llama

    ours = Tokenizer.from_file(str(smollm2 / "tokenizer.json"))
    original = Tokenizer.from_file(str(PUBLIC_FIXTURES / "smollm2/tokenizer.json"))
    llama = Llama(model_path=str(SMOLLM2_GGUF), vocab_only=True, verbose=False)
    for text in SAMPLE_TEXTS:
        ids = ours.encode(text, add_special_tokens=False).ids
        assert ids == original.encode(text, add_special_tokens=False).ids, text
        assert ids == llama.tokenize(text.encode(), add_bos=False, special=True), text
        assert ours.decode(ids, skip_special_tokens=False) == text
    config = json.loads((smollm2 / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|im_end|>" or config["eos_token"] == "<|endoftext|>"
    assert "<|im_start|>" in config["chat_template"]


def test_config_loads_in_mlx_lm(smollm2):
    from mlx_lm.utils import load_model

    model, config = load_model(smollm2)
    assert config["model_type"] == "llama"
    assert config["tie_word_embeddings"] is True
    logits = model(mx.array([[1, 2, 3]]))
    assert logits.shape == (1, 3, 49152)


def test_unsupported_type_is_refused(tmp_path):
    writer = gguf.GGUFWriter(str(tmp_path / "k.gguf"), "llama")
    writer.add_block_count(1)
    writer.add_embedding_length(256)
    writer.add_head_count(2)
    writer.add_context_length(64)
    writer.add_feed_forward_length(256)
    writer.add_layer_norm_rms_eps(1e-5)
    q4k = np.zeros((4, 144), dtype=np.uint8)  # 4 rows of one 256-element Q4_K block each
    writer.add_tensor("token_embd.weight", q4k,
                      raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    result = subprocess.run([tool("convert"), "gguf", str(tmp_path / "k.gguf"), str(tmp_path / "o")],
                            capture_output=True, text=True)
    assert result.returncode != 0
    assert "Q4_K" in result.stderr and "Q4_0, Q4_1, Q8_0" in result.stderr
    assert "token_embd.weight" in result.stderr
