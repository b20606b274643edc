"""Checkpoints written by MLX itself (single file and sharded by mlx-lm's save_model) read back
exactly through dspark's safetensors reader: every tensor, its dtype, shape and bytes."""
import json
import subprocess

import mlx.core as mx
import mlx.nn as nn
import mlx_lm.utils
import pytest
from mlx_lm.models import llama

from conftest import tool


def tiny_quantized_llama():
    mx.random.seed(7)
    args = llama.ModelArgs(model_type="llama", hidden_size=64, num_hidden_layers=2,
                           intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                           rms_norm_eps=1e-5, vocab_size=96, tie_word_embeddings=False)
    model = llama.Model(args)
    model.set_dtype(mx.bfloat16)
    nn.quantize(model, group_size=32, bits=4,
                class_predicate=lambda path, m: hasattr(m, "to_quantized") and "mlp" in path)
    mx.eval(model.parameters())
    return model


def copy_through_dspark(source, out):
    subprocess.run([tool("checkpoint"), "copy", str(source), str(out)], check=True)
    return mx.load(str(out))


def assert_same(expected: dict, actual: dict):
    assert sorted(expected) == sorted(actual)
    for name, array in expected.items():
        got = actual[name]
        assert got.dtype == array.dtype, name
        assert got.shape == array.shape, name
        assert mx.array_equal(got, array, equal_nan=True).item(), name


@pytest.mark.parametrize("sharded", [False, True])
def test_mlx_lm_saved_model_reads_back(tmp_path, sharded, monkeypatch):
    model = tiny_quantized_llama()
    if sharded:
        original = mlx_lm.utils.make_shards

        def three_shards(weights, max_file_size_gb=5):
            items = list(weights.items())
            thirds = [dict(items[i::3]) for i in range(3)]
            assert original(weights, max_file_size_gb)  # the real function still runs
            return thirds

        monkeypatch.setattr(mlx_lm.utils, "make_shards", three_shards)
    mlx_lm.utils.save_model(tmp_path / "model", model)
    files = sorted(p.name for p in (tmp_path / "model").glob("*.safetensors"))
    assert len(files) == (3 if sharded else 1)
    expected = {}
    for name in files:
        expected.update(mx.load(str(tmp_path / "model" / name)))
    assert any(v.dtype == mx.uint32 for v in expected.values())
    assert any(v.dtype == mx.bfloat16 for v in expected.values())
    actual = copy_through_dspark(tmp_path / "model", tmp_path / "copy.safetensors")
    assert_same(expected, actual)


def test_every_dtype_and_odd_sizes(tmp_path):
    mx.random.seed(3)
    arrays = {
        "f32": mx.random.normal((3, 5)),
        "f16": mx.random.normal((7,)).astype(mx.float16),
        "bf16": mx.random.normal((2, 3, 3)).astype(mx.bfloat16),
        "u8": mx.array([1, 2, 255], dtype=mx.uint8),
        "i8": mx.array([-1, 2, -128], dtype=mx.int8),
        "u16": mx.array([65535, 3], dtype=mx.uint16),
        "i16": mx.array([-32768, 3], dtype=mx.int16),
        "u32": mx.array([0xDEADBEEF, 1, 2], dtype=mx.uint32),
        "i32": mx.array([-7, 1 << 30], dtype=mx.int32),
        "i64": mx.array([-(1 << 40), 5], dtype=mx.int64),
        "u64": mx.array([1 << 40, 5], dtype=mx.uint64),
        "bool": mx.array([True, False, True]),
        "scalar": mx.array(2.5),
        "empty": mx.zeros((0, 4)),
    }
    mx.save_safetensors(str(tmp_path / "all.safetensors"), arrays, metadata={"format": "mlx"})
    actual = copy_through_dspark(tmp_path / "all.safetensors", tmp_path / "copy.safetensors")
    assert_same(arrays, actual)
    # Without metadata MLX writes "__metadata__": null.
    mx.save_safetensors(str(tmp_path / "bare.safetensors"), arrays)
    assert_same(arrays, copy_through_dspark(tmp_path / "bare.safetensors", tmp_path / "c2.safetensors"))


def test_config_parsed(tmp_path):
    config = {"model_type": "llama", "quantization": {"group_size": 32, "bits": 4}}
    model = tiny_quantized_llama()
    mlx_lm.utils.save_model(tmp_path, model)
    (tmp_path / "config.json").write_text(json.dumps(config))
    out = subprocess.run([tool("checkpoint"), "config", str(tmp_path)], check=True,
                         capture_output=True, text=True).stdout
    assert json.loads(out) == config
