"""The model forward against mlx-lm running the same checkpoint in float32 on the CPU.

Tiny random models (scripts/make_tiny_models.py, built with mlx-lm's own model classes, cached
under the build dir) go through the same token script in mlx-lm and in dspark_tool_model:
  scenario "decode": a 50-token prefill (logits of every row, taps of several layers), 20 greedy
    decode steps (the tokens mlx-lm picks), a 12-token run and a 40-token run on top of the state;
  scenario "rollback": a 50-token prefill, a recorded 8-token run, a trim back to 53 tokens, then
    one token and a 5-token run, against mlx-lm processing only the kept tokens.
Quantized (4/6/8-bit) variants and bf16 checkpoints in the Hugging Face layout (per-expert
tensors, conv [C, 1, K]) are included; mlx-lm runs all of them in float32.
Every row's argmax must agree (unless mlx-lm's top two are closer than the tolerance) and logits
and taps must agree within a float32 tolerance. The largest differences go to
$DSPARK_BUILD_DIR/oracle_reports/model_mlx.json.
"""

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

SOURCE_DIR = Path(os.environ.get("DSPARK_SOURCE_DIR", Path(__file__).resolve().parents[2]))
BUILD_DIR = Path(os.environ.get("DSPARK_BUILD_DIR", SOURCE_DIR / "build"))
TOOL = Path(os.environ.get("DSPARK_TOOL_MODEL", BUILD_DIR / "tests" / "dspark_tool_model"))
sys.path.insert(0, str(SOURCE_DIR / "scripts"))
import make_tiny_models  # noqa: E402

LOGIT_TOLERANCE = 2e-3
TAP_TOLERANCE = 2e-3  # relative to the tap's largest magnitude
REPORT = {}

mx.set_default_device(mx.cpu)


@pytest.fixture(scope="session")
def models_dir():
    directory = BUILD_DIR / "tiny_models"
    for name in make_tiny_models.model_names():
        make_tiny_models.build(name, directory)
    return directory


@pytest.fixture(scope="session", autouse=True)
def write_report():
    yield
    path = BUILD_DIR / "oracle_reports" / "model_mlx.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(REPORT, indent=2, sort_keys=True) + "\n")


class MlxRunner:
    """Runs mlx-lm's own model call and records the residual stream after every layer."""

    def __init__(self, path):
        self.model, self.config = load_model(Path(path))
        # bf16 checkpoints run in float32 too: the same weight values, an accurate oracle.
        self.model.set_dtype(mx.float32)
        self.taps = {}
        layers = self.model.layers
        for i, layer in enumerate(layers):
            self._tap(layer, i)
        embedding = (
            self.model.backbone.embeddings
            if hasattr(self.model, "backbone")
            else self.model.model.embed_tokens
        )
        self._tap(embedding, -1)
        self.num_layers = len(layers)
        self.reset()

    def _tap(self, module, index):
        base = type(module)
        taps = self.taps

        def call(this, *args, **kwargs):
            out = base.__call__(this, *args, **kwargs)
            taps[index] = out
            return out

        module.__class__ = type(f"Tapped{base.__name__}", (base,), {"__call__": call})

    def reset(self):
        self.cache = make_prompt_cache(self.model)

    def run(self, tokens, tap_layers=()):
        self.taps.clear()
        logits = self.model(mx.array([tokens], dtype=mx.int32), cache=self.cache)
        mx.eval(logits, *self.taps.values())
        taps = None
        if tap_layers:
            taps = np.stack([np.array(self.taps[l][0]) for l in tap_layers], axis=1)
        return np.array(logits[0].astype(mx.float32)), taps


def run_tool(checkpoint, steps, work):
    work.mkdir(parents=True, exist_ok=True)
    script = work / "script.json"
    script.write_text(json.dumps({"steps": steps}))
    result = subprocess.run(
        [str(TOOL), str(checkpoint), str(script), str(work)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    outputs = {}
    for i, step in enumerate(steps):
        if step["op"] == "forward":
            logits = np.load(work / f"step{i}_logits.npy")
            taps_path = work / f"step{i}_taps.npy"
            outputs[i] = (logits, np.load(taps_path) if taps_path.exists() else None)
    return outputs


class Comparison:
    def __init__(self, name):
        self.name = name
        self.max_logit = 0.0
        self.max_tap = 0.0
        self.rows = 0

    def logits(self, ours, ref, what):
        assert ours.shape == ref.shape, f"{what}: shape {ours.shape} vs {ref.shape}"
        delta = float(np.max(np.abs(ours - ref)))
        self.max_logit = max(self.max_logit, delta)
        assert delta <= LOGIT_TOLERANCE, f"{self.name} {what}: max |Δlogit| {delta}"
        top2 = np.sort(ref, axis=-1)[:, -2:]
        decided = (top2[:, 1] - top2[:, 0]) > LOGIT_TOLERANCE
        agree = np.argmax(ours, axis=-1) == np.argmax(ref, axis=-1)
        bad = np.nonzero(decided & ~agree)[0]
        assert bad.size == 0, f"{self.name} {what}: argmax differs at rows {bad.tolist()}"
        self.rows += ours.shape[0]

    def taps(self, ours, ref, what):
        assert ours.shape == ref.shape, f"{what}: taps shape {ours.shape} vs {ref.shape}"
        scale = np.maximum(np.max(np.abs(ref), axis=(0, 2), keepdims=True), 1.0)
        delta = float(np.max(np.abs(ours - ref) / scale))
        self.max_tap = max(self.max_tap, delta)
        assert delta <= TAP_TOLERANCE, f"{self.name} {what}: max relative |Δtap| {delta}"

    def report(self, scenario):
        REPORT.setdefault(self.name, {})[scenario] = {
            "max_abs_logit_delta": self.max_logit,
            "max_rel_tap_delta": self.max_tap,
            "rows_compared": self.rows,
        }


def tokens_for(name, count, salt):
    rng = np.random.default_rng(zlib.crc32(f"{name}/{salt}".encode()))
    return rng.integers(0, make_tiny_models.VOCAB, count).tolist()


@pytest.mark.parametrize("name", make_tiny_models.model_names())
def test_decode_matches_mlx(name, models_dir, tmp_path):
    path = models_dir / name
    mlx = MlxRunner(path)
    L = mlx.num_layers
    tap_layers = sorted({-1, 0, L // 2, L - 1})
    prefill = tokens_for(name, 50, "prefill")
    second = tokens_for(name, 12, "second")
    third = tokens_for(name, 40, "third")

    expected = []  # (what, logits, taps or None)
    steps = []
    logits, taps = mlx.run(prefill, tap_layers)
    expected.append(("prefill", logits, taps))
    steps.append(
        {"op": "forward", "tokens": prefill, "logit_rows": "all", "tap_layers": tap_layers}
    )
    token = int(np.argmax(logits[-1]))
    for i in range(20):
        logits, _ = mlx.run([token])
        expected.append((f"decode {i}", logits, None))
        steps.append({"op": "forward", "tokens": [token], "logit_rows": [0]})
        token = int(np.argmax(logits[-1]))
    for what, chunk in (("12-token run", second), ("40-token run", third)):
        logits, taps = mlx.run(chunk, tap_layers)
        expected.append((what, logits, taps))
        steps.append(
            {"op": "forward", "tokens": chunk, "logit_rows": "all", "tap_layers": tap_layers}
        )

    outputs = run_tool(path, steps, tmp_path)
    check = Comparison(name)
    for index, (what, logits, taps) in zip(sorted(outputs), expected):
        ours_logits, ours_taps = outputs[index]
        check.logits(ours_logits, logits, what)
        if taps is not None:
            check.taps(ours_taps, taps, what)
    check.report("decode")


@pytest.mark.parametrize("name", [n for n in make_tiny_models.model_names() if "_q" not in n])
def test_rollback_matches_mlx(name, models_dir, tmp_path):
    path = models_dir / name
    mlx = MlxRunner(path)
    prefill = tokens_for(name, 50, "prefill")
    verify = tokens_for(name, 8, "verify")
    after = tokens_for(name, 6, "after")
    keep = 3

    mlx.run(prefill)
    mlx.run(verify[:keep])
    expected_one, _ = mlx.run(after[:1])
    expected_run, _ = mlx.run(after[1:])

    steps = [
        {"op": "forward", "tokens": prefill},
        {"op": "recording", "on": True},
        {"op": "forward", "tokens": verify},
        {"op": "trim", "length": len(prefill) + keep},
        {"op": "forward", "tokens": after[:1], "logit_rows": [0]},
        {"op": "forward", "tokens": after[1:], "logit_rows": "all"},
    ]
    outputs = run_tool(path, steps, tmp_path)
    check = Comparison(name)
    check.logits(outputs[4][0], expected_one, "first token after trim")
    check.logits(outputs[5][0], expected_run, "run after trim")
    check.report("rollback")
