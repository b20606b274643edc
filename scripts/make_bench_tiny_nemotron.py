#!/usr/bin/env python3
"""Writes a tiny nemotron_h model that `dspark benchmark` can run end to end.

The layers are make_tiny_models.py's nemotron_m recipe (every nemotron_h layer kind: Mamba-2,
attention, MoE, dense MLP), built with mlx-lm's own model class, random weights from a fixed seed,
quantized to MLX affine 4-bit (group 64); the vocabulary is sized for the Nemotron-structured
tokenizer fixture (tests/fixtures/nemotron-tiny), whose files and chat template are copied in.
The weights are random, so its text is nonsense: it measures speed and acceptance mechanics.

Beside it, OUT_DIR-DSpark holds a random one-layer DeepSpec-packaged DSpark drafter for it (block 7,
taps after layers 1 and 3, Markov rank 64), from make_tiny_drafters.py's recipe with this vocabulary:
a drafter that is almost never right, which is what the cap controller's parking is for.

    make_bench_tiny_nemotron.py OUT_DIR

OUT_DIR is rewritten only when its recipe changed. Never write it into the source tree.
"""

import copy
import json
import os
import shutil
import sys
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models import nemotron_h
from mlx_lm.utils import quantize_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_tiny_drafters  # noqa: E402
import make_tiny_models  # noqa: E402

RECIPE_VERSION = 2
DRAFTER = ("deepspec", "nemotron_m", dict(layers=1, block=7, taps=[1, 3], rank=64, seed=41))
FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "nemotron-tiny"
SEED = 7


def vocab_size():
    tokenizer = json.loads((FIXTURE / "tokenizer.json").read_text())
    ids = list(tokenizer["model"]["vocab"].values()) + [t["id"] for t in tokenizer.get("added_tokens", [])]
    return max(ids) + 1


def write_drafter(directory, vocab):
    """make_tiny_drafters' DeepSpec drafter, sized for this target's vocabulary."""
    make_tiny_drafters.VOCAB = vocab
    make_tiny_drafters.MASK = vocab - 1
    make_tiny_drafters.DRAFTERS[directory.name] = DRAFTER
    make_tiny_drafters.build(directory.name, directory.parent)
    drafter_config = json.loads((directory / "config.json").read_text())
    drafter_config["num_target_layers"] = len(make_tiny_models.BASE_MODELS["nemotron_m"]["hybrid_override_pattern"])
    (directory / "config.json").write_text(json.dumps(drafter_config, indent=2))


def main(argv):
    if len(argv) != 2:
        print(__doc__)
        return 2
    target = Path(argv[1])
    config = copy.deepcopy(make_tiny_models.BASE_MODELS["nemotron_m"])
    config["vocab_size"] = vocab_size()
    config["eos_token_id"] = json.loads((FIXTURE / "tokenizer.json").read_text())["model"]["vocab"].get(
        "<|im_end|>", 0
    )
    recipe = {"version": RECIPE_VERSION, "config": config, "seed": SEED, "bits": 4, "drafter": DRAFTER}
    stamp = target / "recipe.json"
    if stamp.exists() and json.loads(stamp.read_text()) == recipe:
        print(target)
        return 0
    model = nemotron_h.Model(nemotron_h.ModelArgs.from_dict(config))
    make_tiny_models.randomize(model, SEED)
    model, config = quantize_model(model, config, group_size=64, bits=4)
    target.mkdir(parents=True, exist_ok=True)
    partial = f".partial-{os.getpid()}"
    written = target / f"model{partial}.safetensors"
    mx.save_safetensors(str(written), dict(tree_flatten(model.parameters())), metadata={"format": "mlx"})
    os.replace(written, target / "model.safetensors")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(FIXTURE / name, target / name)
    write_drafter(target.parent / f"{target.name}-DSpark", config["vocab_size"])
    for path, text in ((target / "config.json", json.dumps(config, indent=2) + "\n"), (stamp, json.dumps(recipe))):
        Path(f"{path}{partial}").write_text(text)
        os.replace(f"{path}{partial}", path)
    print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
