"""dspark_tool_taps, the data the default model's DSpark head is distilled from
(docs/training.md), against mlx-lm on the default model (mlx-lm in float32, dspark on its fp32
path): the tool's answer is mlx-lm's greedy continuation, its taps are mlx-lm's residual stream
after the tap layers, and its top-k distributions are mlx-lm's softmax.
"""
import json
import os
import subprocess
from pathlib import Path

import jinja2
import mlx.core as mx
import numpy as np
import pytest
from tokenizers import Tokenizer

from conftest import tool
from mlx_lm.models.base import create_attention_mask
from mlx_lm.utils import load_model

mx.set_default_device(mx.cpu)

MODEL = Path(os.environ.get("DSPARK_MODELS_DIR", Path.home() / ".cache/dspark/models")) / \
    "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def target():
    model, _ = load_model(MODEL)
    model.set_dtype(mx.float32)
    return model


def chat_ids(text):
    """The prompt as one user turn of the model's chat template, rendered by jinja2 and
    tokenized by Hugging Face tokenizers."""
    config = json.loads((MODEL / "tokenizer_config.json").read_text())
    rendered = jinja2.Template(config["chat_template"]).render(
        messages=[{"role": "user", "content": text}], add_generation_prompt=True)
    return Tokenizer.from_file(str(MODEL / "tokenizer.json")).encode(
        rendered, add_special_tokens=False).ids


def residual_stream(model, tokens, layers):
    """mlx-lm's hidden state after each of `layers` and the logits of every row."""
    inner = model.model
    h = inner.embed_tokens(mx.array([tokens]))
    mask = create_attention_mask(h, None)
    taps = {}
    for i, layer in enumerate(inner.layers):
        h = layer(h, mask, None)
        if i in layers:
            taps[i] = np.array(h[0])
    logits = np.array(inner.embed_tokens.as_linear(inner.norm(h))[0])
    return taps, logits


def test_taps_tool_matches_mlx_lm(tmp_path, target):
    layers = [1, 13, 28]
    script = {"model": str(MODEL), "taps": layers, "top_k": 8, "max_tokens": 24,
              "prompts": [{"id": "a", "text": "Write a Python function that adds two numbers."},
                          {"id": "b", "text": "What is 12 times 7?"}]}
    (tmp_path / "script.json").write_text(json.dumps(script))
    subprocess.run([tool("taps"), str(tmp_path / "script.json"), str(tmp_path / "out")],
                   check=True)
    index = json.loads((tmp_path / "out.json").read_text())
    blob = np.fromfile(tmp_path / "out.bin", dtype=np.uint8)
    offset = 0
    H, K = index["hidden"], index["top_k"]
    for prompt, record in zip(script["prompts"], index["sequences"]):
        tokens, n = record["tokens"], len(record["tokens"])
        assert tokens[: record["prompt_tokens"]] == chat_ids(prompt["text"])
        taps = blob[offset:offset + n * len(layers) * H * 2].view(np.float16).reshape(
            n, len(layers), H)
        offset += taps.nbytes
        top_ids = blob[offset:offset + n * K * 4].view(np.int32).reshape(n, K)
        offset += top_ids.nbytes
        top_probs = blob[offset:offset + n * K * 4].view(np.float32).reshape(n, K)
        offset += top_probs.nbytes
        reference, logits = residual_stream(target, tokens, layers)
        for column, layer in enumerate(layers):
            scale = np.abs(reference[layer]).max()
            np.testing.assert_allclose(taps[:, column].astype(np.float32), reference[layer],
                                       atol=2e-3 * scale)
        shifted = logits - logits.max(-1, keepdims=True)
        probs = np.exp(shifted) / np.exp(shifted).sum(-1, keepdims=True)
        reference_probs = np.take_along_axis(probs, top_ids.astype(np.int64), axis=-1)
        np.testing.assert_allclose(top_probs, reference_probs, atol=1e-4)
        # Greedy decoding: each answer token is the target's argmax after the tokens before it
        # (unless mlx-lm's top two are a near-tie), and the tool's top-1 says the same.
        for row in range(record["prompt_tokens"] - 1, n - 1):
            top_two = np.sort(logits[row])[-2:]
            if top_two[1] - top_two[0] > 1e-3:
                assert tokens[row + 1] == int(logits[row].argmax()) == top_ids[row, 0]
    assert offset == blob.size
