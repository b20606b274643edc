"""A full-size nemotron_h forward in dspark against mlx-lm: a 64-token prefill and 4 greedy decode
steps, every logit row compared.

A heavy one-off run for the 17.8 GB synthetic Nemotron 30B-A3B (docs/full-size.md), not a test:
both engines cannot hold the model at once in 24 GiB, so they run one after the other.

1. dspark, fp32 numerics (DSPARK_NUMERICS=fp32, the oracle path): `dspark_tool_generate` decodes 5
   greedy tokens after the prompt (fixing the 4 decode inputs), then `dspark_tool_model` runs the
   prompt (all 64 logit rows) and the 4 decode steps (one row each).
2. mlx-lm on the CPU in float32, layer by layer: mlx-lm's own `NemotronHBlock` for each layer,
   quantized as its loader does, loaded from that layer's shard and cast to float32, runs the
   prompt and then the 4 decode tokens with its own cache, and is freed before the next layer.
   Feeding layer l+1 the outputs of layer l for every step is the same computation as the usual
   step-by-step order, since each step of a layer depends only on its input and its own cache.

Prints the largest |Δlogit| (overall, prefill, decode), the argmax agreement of the 68 rows, the
5 greedy tokens of both, and each engine's wall time; `--json` writes the same.

    bench/full_size_mlx_check.py [--model DIR] [--build build] [--json out.json]
"""
import argparse
import json
import os
import pathlib
import struct
import subprocess
import sys
import tempfile
import time
import types

import numpy as np

PROMPT_TOKENS = 64
DECODE_STEPS = 4


def prompt_ids(vocab, seed=64):
    return np.random.default_rng(seed).integers(3, vocab, PROMPT_TOKENS).tolist()


def run_dspark(build, model_dir, prompt, work):
    env = dict(os.environ, DSPARK_NUMERICS="fp32")
    requests = work / "requests.json"
    requests.write_text(json.dumps({"max_tokens": DECODE_STEPS + 1, "prompts": [prompt]}))
    start = time.monotonic()
    subprocess.run([str(build / "tests/dspark_tool_generate"), str(model_dir), str(requests),
                    str(work / "generated.json")], check=True, env=env)
    generate_s = time.monotonic() - start
    tokens = json.loads((work / "generated.json").read_text())["outputs"][0]["tokens"]
    steps = [{"op": "forward", "tokens": prompt, "logit_rows": "all"}]
    steps += [{"op": "forward", "tokens": [t], "logit_rows": [0]} for t in tokens[:DECODE_STEPS]]
    (work / "script.json").write_text(json.dumps({"steps": steps}))
    start = time.monotonic()
    subprocess.run([str(build / "tests/dspark_tool_model"), str(model_dir),
                    str(work / "script.json"), str(work)], check=True, env=env)
    forward_s = time.monotonic() - start
    logits = np.concatenate([np.load(work / f"step{i}_logits.npy") for i in range(len(steps))])
    return tokens, logits, generate_s, forward_s


class LayerLoader:
    """mlx-lm modules for one part of the checkpoint at a time, quantized and loaded as
    mlx_lm.utils.load_model would, then cast to float32."""

    def __init__(self, model_dir):
        import mlx.core as mx
        from mlx_lm.models import nemotron_h

        self.mx = mx
        self.nemotron_h = nemotron_h
        self.dir = model_dir
        self.config = json.loads((model_dir / "config.json").read_text())
        self.args = nemotron_h.ModelArgs.from_dict(self.config)
        index = model_dir / "model.safetensors.index.json"
        if index.exists():
            self.shard_of = json.loads(index.read_text())["weight_map"]
        else:  # one file: its header names the tensors
            with open(model_dir / "model.safetensors", "rb") as f:
                header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
            self.shard_of = {name: "model.safetensors" for name in header if name != "__metadata__"}

    def weights(self, parts):
        wanted = lambda name: any(name.startswith(part) for part in parts)  # noqa: E731
        shards = sorted({s for name, s in self.shard_of.items() if wanted(name)})
        weights = {}
        for shard in shards:
            loaded = self.mx.load(str(self.dir / shard))
            weights.update({k: v for k, v in loaded.items() if wanted(k)})
        # The loader's own renames and layout fixes (a no-op on an mlx-lm checkpoint).
        owner = types.SimpleNamespace(args=self.args)
        return self.nemotron_h.Model.sanitize(owner, weights)

    def load(self, module, prefix, parts=None):
        """`module` holds the tensors named `prefix` + its own names; `parts` (default: all
        under `prefix`) picks which."""
        import mlx.nn as nn

        weights = {k[len(prefix):]: v for k, v in self.weights(parts or [prefix]).items()}
        quantization = self.config.get("quantization")
        if quantization:
            overrides = {k[len(prefix):]: v for k, v in quantization.items()
                         if isinstance(v, dict) and k.startswith(prefix)}

            def predicate(path, layer):
                if path in overrides:
                    return overrides[path]
                return hasattr(layer, "to_quantized") and f"{path}.scales" in weights

            nn.quantize(module, group_size=quantization["group_size"], bits=quantization["bits"],
                        mode=quantization.get("mode", "affine"), class_predicate=predicate)
        module.load_weights(list(weights.items()), strict=True)
        module.set_dtype(self.mx.float32)
        self.mx.eval(module.parameters())
        return module


def run_mlx(model_dir, prompt, tokens):
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models.base import create_attention_mask, create_ssm_mask
    from mlx_lm.models.cache import ArraysCache, KVCache

    mx.set_default_device(mx.cpu)
    start = time.monotonic()
    loader = LayerLoader(model_dir)
    args = loader.args

    class Ends(nn.Module):
        def __init__(self):
            super().__init__()
            self.embeddings = nn.Embedding(args.vocab_size, args.hidden_size)
            self.norm_f = nn.RMSNorm(args.hidden_size, eps=args.layer_norm_epsilon)

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    ends = loader.load(Ends(), "backbone.", ["backbone.embeddings.", "backbone.norm_f."])
    inputs = [prompt] + [[t] for t in tokens[:DECODE_STEPS]]
    hidden = [ends.embeddings(mx.array([ids], dtype=mx.int32)).astype(mx.float32) for ids in inputs]
    mx.eval(hidden)
    for index, kind in enumerate(args.hybrid_override_pattern):
        block = loader.load(loader.nemotron_h.NemotronHBlock(args, kind),
                            f"backbone.layers.{index}.")
        cache = ArraysCache(size=2) if kind == "M" else KVCache() if kind == "*" else None
        for step, h in enumerate(hidden):
            mask = None
            if kind == "*":
                mask = create_attention_mask(h, cache)
            elif kind == "M":
                mask = create_ssm_mask(h, cache)
            hidden[step] = block(h, mask=mask, cache=cache) if kind in "M*" else block(h)
            mx.eval(hidden[step])
        del block, cache
        print(f"mlx-lm: layer {index} ({kind}) done at {time.monotonic() - start:.0f} s",
              file=sys.stderr, flush=True)
    if any(name.startswith("lm_head.") for name in loader.shard_of):
        project = loader.load(Head(), "", ["lm_head."]).lm_head
    else:  # tied: mlx-lm projects with the embedding
        project = ends.embeddings.as_linear
    logits = [project(ends.norm_f(h))[0] for h in hidden]
    mx.eval(logits)
    out = np.concatenate([np.array(l.astype(mx.float32)) for l in logits])
    return out, time.monotonic() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=pathlib.Path,
                        default=pathlib.Path.home() / ".cache/dspark/synthetic/nano-52L-4bit")
    parser.add_argument("--build", type=pathlib.Path,
                        default=pathlib.Path(__file__).resolve().parents[1] / "build")
    parser.add_argument("--json", type=pathlib.Path)
    options = parser.parse_args()

    vocab = json.loads((options.model / "config.json").read_text())["vocab_size"]
    prompt = prompt_ids(vocab)
    with tempfile.TemporaryDirectory() as tmp:
        tokens, ours, generate_s, forward_s = run_dspark(options.build, options.model, prompt,
                                                         pathlib.Path(tmp))
    print(f"dspark fp32: greedy tokens {tokens} in {generate_s:.1f} s; the 68-row script in "
          f"{forward_s:.1f} s", file=sys.stderr, flush=True)
    ref, mlx_s = run_mlx(options.model, prompt, tokens)

    assert ours.shape == ref.shape, f"logit rows {ours.shape} vs {ref.shape}"
    finite = bool(np.isfinite(ours).all() and np.isfinite(ref).all())
    delta = np.abs(ours - ref)
    next_rows = [PROMPT_TOKENS - 1] + list(range(PROMPT_TOKENS, PROMPT_TOKENS + DECODE_STEPS))
    top2 = np.sort(ref, axis=-1)[:, -2:]
    result = {
        "model": str(options.model),
        "prompt_tokens": PROMPT_TOKENS,
        "decode_steps": DECODE_STEPS,
        "finite": finite,
        "max_abs_logit_delta": float(delta.max()),
        "max_abs_logit_delta_prefill": float(delta[:PROMPT_TOKENS].max()),
        "max_abs_logit_delta_decode": float(delta[PROMPT_TOKENS:].max()),
        "max_abs_logit": float(np.abs(ref).max()),
        "logit_std": float(ref.std()),
        "argmax_agreement_rows": int((ours.argmax(-1) == ref.argmax(-1)).sum()),
        "rows": int(ref.shape[0]),
        "smallest_top2_margin": float((top2[:, 1] - top2[:, 0]).min()),
        "dspark_greedy": tokens,
        "mlx_greedy": [int(ref[r].argmax()) for r in next_rows],
        "dspark_seconds": {"generate": generate_s, "forward_script": forward_s},
        "mlx_seconds": mlx_s,
    }
    print(json.dumps(result, indent=2))
    if options.json:
        options.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
