"""The default model's trained DSpark head (data/dspark_head/SmolLM2-135M-Instruct-DSpark, or
$DSPARK_HEAD_DIR; docs/training.md) against mlx-dspark: both load it, and on held-out prompts
(data/dspark_head/heldout, never trained on) both draft the same tokens with the same logits and
confidences, quantized to 4 bits at load and as stored. mlx-dspark's own loader reads and
quantizes the checkpoint; its weights (and the target's) are then widened to float32, exactly,
so that MLX on the CPU computes in float32 like the oracle tests' dspark.
"""
import json
import os
import subprocess
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from conftest import SOURCE_DIR, tool
from test_drafter_mlx_dspark import load_drafter
from test_taps_tool import MODEL, chat_ids, target  # noqa: F401 (target is a fixture)

HEAD = Path(os.environ.get("DSPARK_HEAD_DIR",
                           SOURCE_DIR / "data/dspark_head/SmolLM2-135M-Instruct-DSpark"))
HELD_OUT = SOURCE_DIR / "data/dspark_head/heldout"
CONTEXTS_PER_SUITE = 8
ACCEPT = [7, 2]  # a full accept, then a partial one: the second round drafts deeper in


def held_out_prompts():
    prompts = []
    for suite in ("chat", "code", "math"):
        lines = (HELD_OUT / f"{suite}.jsonl").read_text().splitlines()[:CONTEXTS_PER_SUITE]
        prompts += [json.loads(line)["prompt"] for line in lines]
    return prompts


def reference_head(bits):
    """mlx-dspark's drafter as its loader makes it (quantized from the stored bf16 weights, so
    with bf16 scales, as dspark's loader quantizes), then widened to float32, exactly."""
    drafter, config = load_drafter(str(HEAD), quantize=bits > 0, bits=max(bits, 4))
    drafter.set_dtype(mx.float32)
    return drafter, config


@pytest.mark.parametrize("bits", [4, 0])
def test_default_head_matches_mlx_dspark(tmp_path, target, bits):
    drafter, config = reference_head(bits)
    assert config.block_size == 7
    # The target's float32 copy: its 8-bit embedding rows dequantized without float16 rounding.
    embed = target.model.embed_tokens
    if config.draft_vocab_size is None:
        assert drafter.lm_head is None
        drafter.bind_lm_head(embed.as_linear)
    else:  # a draft vocabulary: the head's own lm_head, and d2t mapping its ids to the target's
        assert drafter.lm_head is not None and drafter._draft_to_target is not None
    drafter.bind_embed(embed)
    n_taps = len(config.target_layer_ids)
    compared = 0
    for prompt in held_out_prompts():
        script = {"target": str(MODEL), "drafter": str(HEAD), "kind": "dspark", "bits": bits,
                  "prompt": chat_ids(prompt), "rounds": len(ACCEPT), "cap": 7, "accept": ACCEPT}
        (tmp_path / "script.json").write_text(json.dumps(script))
        subprocess.run([tool("drafter"), str(tmp_path / "script.json"), str(tmp_path / "o.json")],
                       check=True)
        out = json.loads((tmp_path / "o.json").read_text())
        fed = np.array(out["fed_taps"], dtype=np.float32).reshape(-1, n_taps * config.hidden_size)
        ctx = drafter.make_ctx_cache()
        done = 0
        for record in out["rounds"]:
            position, pending = record["position"], record["pending"]
            drafter.update_context(mx.array(fed[done:position])[None], done, ctx)
            done = position
            width = drafter.draft_width(drafter.max_draft)
            block = mx.array([[pending] + [config.mask_token_id] * (width - 1)])
            hidden = drafter.head_slice(drafter.backbone(drafter.embed(block), position, ctx),
                                        drafter.max_draft)
            base = drafter.compute_logits(hidden)[0]
            tokens = drafter.sample_block(base, first_prev_token=pending).tolist()
            prev = mx.array([pending] + tokens[:-1])
            logits = np.array(base + drafter.markov_head.step_bias(prev))
            confidence = np.array(mx.sigmoid(drafter.confidence_logits(hidden[0], prev)))
            assert record["drafts"] == tokens, f"{prompt[:60]!r} at {position}"
            ours = np.array(record["logits"], dtype=np.float32).reshape(logits.shape)
            np.testing.assert_allclose(ours, logits, rtol=1e-3, atol=2e-3)
            np.testing.assert_allclose(np.array(record["confidences"]), confidence, atol=1e-4)
            compared += 1
    assert compared >= 20
