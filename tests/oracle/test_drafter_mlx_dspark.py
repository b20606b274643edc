"""DSpark and DFlash drafters against mlx-dspark (the reference implementation, run on MLX's CPU
build) on tiny random drafters in every packaging, paired with tiny nemotron_h and qwen3 targets.

Our tool runs the target, feeds the drafter every committed row and drafts greedily for a few
rounds with varied acceptance; the reference replays the same fed rows (the target's taps, which
the model oracle tests cover) into mlx-dspark's drafter and must give the same draft tokens,
matching logits (Markov bias included) and confidences.

mlx-dspark imports `mlx_vlm.models.rope_utils.initialize_rope`; mlx-vlm's package __init__ pulls
in its image stack (PIL, transformers), which this venv does not carry, so the installed
mlx_vlm directory is registered as a namespace without running that __init__: the rope module
itself only needs mlx.
"""
import importlib.util
import json
import subprocess
import sys
import types

import mlx.core as mx
import numpy as np
import pytest

from conftest import SOURCE_DIR, tool

sys.path.insert(0, str(SOURCE_DIR / "scripts"))
import make_tiny_drafters  # noqa: E402
import make_tiny_models  # noqa: E402


def _register_mlx_vlm_without_init():
    if "mlx_vlm" in sys.modules:
        return
    spec = importlib.util.find_spec("mlx_vlm")
    if spec is None:
        pytest.skip("mlx-vlm is not installed (scripts/requirements-test.txt)")
    package = types.ModuleType("mlx_vlm")
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules["mlx_vlm"] = package


_register_mlx_vlm_without_init()
from mlx_dspark.load import load_dflash, load_drafter  # noqa: E402
from mlx_lm.utils import load_model  # noqa: E402

mx.set_default_device(mx.cpu)

PROMPT = [5, 17, 99, 260, 3, 44, 301, 7, 12, 480, 33]
ACCEPT = [2, 0, 5, 1]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("drafters")
    targets = {n: make_tiny_models.build(n, root / "targets") for n in ("qwen3_tied", "nemotron_attn")}
    return root, targets


def target_modules(target_dir):
    model, config = load_model(target_dir)
    inner = model.model if hasattr(model, "model") else model.backbone
    embed = inner.embed_tokens if hasattr(inner, "embed_tokens") else inner.embeddings
    tied = config.get("tie_word_embeddings", True) and not hasattr(model, "lm_head")
    head = embed.as_linear if tied else model.lm_head
    return embed, head


def run_tool(tmp_path, target_dir, drafter_dir, kind, bits, cap, rounds=4, generate=None,
             one_row_at_a_time=False, grouped=False):
    script = {"target": str(target_dir), "drafter": str(drafter_dir), "kind": kind, "bits": bits,
              "prompt": PROMPT, "rounds": rounds, "cap": cap, "accept": ACCEPT,
              "one_row_at_a_time": one_row_at_a_time, "grouped": grouped}
    if generate is not None:
        script["generate"] = generate
    (tmp_path / "script.json").write_text(json.dumps(script))
    subprocess.run([tool("drafter"), str(tmp_path / "script.json"), str(tmp_path / "out.json")],
                   check=True)
    return json.loads((tmp_path / "out.json").read_text())


def compare(ours, reference_tokens, reference_logits, reference_conf):
    assert ours["drafts"] == reference_tokens
    logits = np.array(ours["logits"], dtype=np.float32).reshape(reference_logits.shape)
    np.testing.assert_allclose(logits, reference_logits, rtol=1e-3, atol=2e-3)
    if reference_conf is not None:
        np.testing.assert_allclose(np.array(ours["confidences"]), reference_conf, atol=1e-4)
        # The drafts' survival estimates, which the confidence schedule reads: the running
        # product of the confidences, one per draft.
        survival = np.cumprod(np.asarray(reference_conf, dtype=np.float64).reshape(-1))
        np.testing.assert_allclose(np.array(ours["survival"]), survival[:len(ours["drafts"])],
                                   atol=1e-4)


DSPARK = [n for n in make_tiny_drafters.DRAFTERS if not n.startswith("dflash")]
DFLASH = [n for n in make_tiny_drafters.DRAFTERS if n.startswith("dflash")]


@pytest.mark.parametrize("bits", [4, 0])
@pytest.mark.parametrize("name", DSPARK)
def test_dspark_matches_mlx_dspark(dirs, tmp_path, name, bits):
    root, targets = dirs
    packaging, target_name, options = make_tiny_drafters.DRAFTERS[name]
    drafter_dir = make_tiny_drafters.build(name, root / "drafters")
    cap = 16  # more than any block: the head's own limit applies
    out = run_tool(tmp_path, targets[target_name], drafter_dir, "dspark", bits, cap)

    drafter, config = load_drafter(str(drafter_dir), quantize=bits > 0, bits=max(bits, 4))
    embed, head = target_modules(targets[target_name])
    if drafter.lm_head is None:
        drafter.bind_lm_head(head)
    n_taps = len(config.target_layer_ids)
    fed = np.array(out["fed_taps"], dtype=np.float32).reshape(-1, n_taps * config.hidden_size)
    ctx = drafter.make_ctx_cache()
    done = 0
    assert len(out["rounds"]) == 4
    for record in out["rounds"]:
        position, pending = record["position"], record["pending"]
        drafter.update_context(mx.array(fed[done:position])[None], done, ctx)
        done = position
        k = drafter.max_draft
        width = drafter.draft_width(k)
        noise = drafter.embed(mx.array([[pending] + [config.mask_token_id] * (width - 1)]))
        hidden = drafter.head_slice(drafter.backbone(noise, position, ctx), k)
        base = drafter.compute_logits(hidden)[0]
        tokens = drafter.sample_block(base, first_prev_token=pending).tolist()
        prev = mx.array([pending] + tokens[:-1])
        logits = base
        if drafter.markov_head is not None:
            logits = base + drafter.markov_head.step_bias(prev)
        conf = None
        if drafter.confidence_head is not None:
            conf = np.array(mx.sigmoid(drafter.confidence_logits(hidden[0], prev)))
        compare(record, tokens, np.array(logits), conf)


@pytest.mark.parametrize("name", [DSPARK[0], DFLASH[0]])
def test_context_fed_in_one_call_or_row_by_row_is_identical(dirs, tmp_path, name):
    """The verify loop holds target rows back while the drafter is not drafting and feeds them in
    one call: every draft and logit must be bit for bit what row-by-row feeding gives."""
    root, targets = dirs
    packaging, target_name, options = make_tiny_drafters.DRAFTERS[name]
    drafter_dir = make_tiny_drafters.build(name, root / "drafters")
    kind = "dflash" if name.startswith("dflash") else "dspark"
    together = run_tool(tmp_path, targets[target_name], drafter_dir, kind, 4, 16)
    row_by_row = run_tool(tmp_path, targets[target_name], drafter_dir, kind, 4, 16,
                          one_row_at_a_time=True)
    assert together["rounds"] == row_by_row["rounds"]
    assert together["committed"] == row_by_row["committed"]


@pytest.mark.parametrize("bits", [4, 0])
@pytest.mark.parametrize("name", DSPARK + DFLASH)
def test_drafters_of_one_head_drafting_together_draft_as_alone(dirs, tmp_path, name, bits):
    """The server drafts for every slot of one head in one pass: each sequence's drafts, logits
    and confidences must be bit for bit what it drafts alone, greedy and sampled, whatever the
    other sequences' contexts and caps."""
    root, targets = dirs
    packaging, target_name, options = make_tiny_drafters.DRAFTERS[name]
    drafter_dir = make_tiny_drafters.build(name, root / "drafters")
    kind = "dflash" if name.startswith("dflash") else "dspark"
    out = run_tool(tmp_path, targets[target_name], drafter_dir, kind, bits, 16, grouped=True)
    for mode in ("greedy", "sampled"):
        alone, grouped = out["alone_" + mode], out["grouped_" + mode]
        assert len(alone) == 4
        assert len({len(a["drafts"]) for a in alone}) > 1, "the caps must differ"
        assert grouped == alone


@pytest.mark.parametrize("bits", [4, 0])
@pytest.mark.parametrize("name", DFLASH)
def test_dflash_matches_mlx_dspark(dirs, tmp_path, name, bits):
    root, targets = dirs
    packaging, target_name, options = make_tiny_drafters.DRAFTERS[name]
    drafter_dir = make_tiny_drafters.build(name, root / "drafters")
    out = run_tool(tmp_path, targets[target_name], drafter_dir, "dflash", bits, 32)
    drafter, config = load_dflash(str(drafter_dir), quantize=bits > 0, bits=max(bits, 4))
    drafter.embed_tokens, drafter.lm_head = target_modules(targets[target_name])
    fed = np.array(out["fed_taps"], dtype=np.float32).reshape(
        -1, len(config.target_layer_ids) * config.hidden_size)
    for record in out["rounds"]:
        position, pending = record["position"], record["pending"]
        block = mx.array([[pending] + [config.mask_token_id] * (config.block_size - 1)])
        # A fresh context per round: after a one-row append into a full sliding-window buffer,
        # mlx-lm's RotatingKVCache returns its rows in rotated order while the DFlash block
        # mask assumes temporal order (rows then drop out of the window by buffer index, not
        # position). Projecting the whole context anew keeps the reference in temporal order.
        cache = drafter.make_cache()
        logits = drafter(block, mx.array(fed[:position])[None], cache, logits_start=1)[0]
        tokens = mx.argmax(logits, axis=-1).tolist()
        compare(record, tokens, np.array(logits), None)


LOSSLESS = [("deepspec_a", 3, 0.0, 0.0), ("deepspec_b", 7, 0.0, 0.0), ("speculators_b", 4, 0.0, 0.5),
            ("nemotron_a", 5, 0.0, 0.0), ("nemotron_c", 2, 0.8, 0.0), ("dflash_b", 4, 0.0, 0.0),
            ("dflash_a", 6, 1.0, 0.0)]


@pytest.mark.parametrize("name,cap,temperature,threshold", LOSSLESS)
def test_speculative_equals_plain_through_the_real_drafter(dirs, tmp_path, name, cap, temperature,
                                                           threshold):
    """Greedy: token for token. Sampled: the same seed gives the same tokens only by chance, so
    at T > 0 the run must complete with drafts verified (distribution equality is the verify
    loop's own test); greedy is the exact check."""
    root, targets = dirs
    packaging, target_name, options = make_tiny_drafters.DRAFTERS[name]
    drafter_dir = make_tiny_drafters.build(name, root / "drafters")
    kind = "dflash" if packaging == "dflash" else "dspark"
    generate = {"max_tokens": 40, "cap": cap, "temperature": temperature, "seed": 7,
                "confidence_threshold": threshold}
    out = run_tool(tmp_path, targets[target_name], drafter_dir, kind, 4, cap, rounds=1,
                   generate=generate)
    assert out["rounds_run"] > 0
    assert len(out["speculative"]) == 40
    if temperature == 0.0:
        assert out["speculative"] == out["plain"]


@pytest.mark.parametrize("drop,message", [
    ("fc.weight", "fc (tap projection) tensor 'fc' is missing"),
    ("hidden_norm.weight", "hidden_norm tensor 'hidden_norm.weight' is missing"),
    ("norm.weight", "final norm tensor 'norm.weight' is missing"),
    ("markov_head.markov_w2.weight", "Markov W2 tensor 'markov_head.markov_w2.weight' is missing"),
])
def test_missing_required_tensor_is_refused(dirs, tmp_path, drop, message):
    from safetensors.numpy import load_file, save_file
    root, targets = dirs
    source = make_tiny_drafters.build("deepspec_a", root / "drafters")
    broken = tmp_path / "broken"
    broken.mkdir()
    weights = load_file(str(source / "model.safetensors"))
    del weights[drop]
    save_file(weights, str(broken / "model.safetensors"), metadata={"format": "mlx"})
    (broken / "config.json").write_text((source / "config.json").read_text())
    script = {"target": str(targets["qwen3_tied"]), "drafter": str(broken), "kind": "dspark",
              "bits": 4, "prompt": PROMPT, "rounds": 1, "cap": 2, "accept": [0]}
    (tmp_path / "script.json").write_text(json.dumps(script))
    run = subprocess.run([tool("drafter"), str(tmp_path / "script.json"), str(tmp_path / "o.json")],
                         capture_output=True, text=True)
    assert run.returncode != 0
    assert message in run.stderr


@pytest.mark.parametrize("edit,message", [
    ({"target_layer_ids": [0, 1]}, "tap layer 1 does not exist"),
    ({"logits_start": 7}, "slot convention cannot be determined"),
    ({"model_type": "llama"}, "unsupported drafter backbone"),
])
def test_bad_config_is_refused(dirs, tmp_path, edit, message):
    root, targets = dirs
    source = make_tiny_drafters.build("deepspec_a", root / "drafters")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model.safetensors").write_bytes((source / "model.safetensors").read_bytes())
    config = json.loads((source / "config.json").read_text())
    config.update(edit)
    (broken / "config.json").write_text(json.dumps(config))
    script = {"target": str(targets["qwen3_tied"]), "drafter": str(broken), "kind": "dspark",
              "bits": 4, "prompt": PROMPT, "rounds": 1, "cap": 2, "accept": [0]}
    (tmp_path / "script.json").write_text(json.dumps(script))
    run = subprocess.run([tool("drafter"), str(tmp_path / "script.json"), str(tmp_path / "o.json")],
                         capture_output=True, text=True)
    assert run.returncode != 0
    assert message in run.stderr
