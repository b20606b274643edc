"""How close each engine's logits are to the float32 reference on the default model,
teacher-forced over real text: the first 4,599 positions of tests/data/tokenizer_corpus.jsonl's
prose (9 windows of 512 tokens, every row but each window's last scored against the next token).

The reference is mlx-lm in float32. mlx-lm's CPU backend needs about 100 s per 512-token window
here, so it runs on the first MLX_CHECKED tokens only, where dspark's fp32 path must equal it
within float32 rounding (test_default_model.py bounds it the same way on 809 more rows); dspark's
fp32 path then stands in for it on all 4,599 positions.

Compared: dspark's int8 path (the default numerics: activations rounded to 8
bits in blocks of 32 before each quantized product, docs/architecture.md) and llama.cpp on the
original GGUF (which rounds its activations to 8 bits the same way). Figures per engine: top-1
agreement with the reference, mean and max KL(reference ‖ engine) per position, and perplexity of
the text. The bar: the int8 path agrees with the reference's top-1 at least as often as llama.cpp
and its perplexity is at least as close to the reference's; its mean KL may exceed llama.cpp's by
at most 5 % (measured on AVX2 with the int8 path's f16 KV cache: top-1 0.9537 for both,
perplexity 16.142 vs llama.cpp's 16.166 against 16.083, mean KL 0.00422 vs 0.00428; with an fp32
cache 16.128 and 0.00437). dspark's int8 figures are the same on every CPU (its rows are bit for
bit the scalar reference's); llama.cpp's move with the kernels it picks for the CPU (AVX2 or
AVX-512 round its 8-bit activations in other orders): on an Emerald Rapids Xeon its AVX-512 VNNI
build gave top-1 0.9519, mean KL 0.00436 and perplexity 16.122, 0.044 from its AVX2 build's
16.166. So "at least as" allows margins of that size: TOP1_MARGIN (9 of 4,599 positions) and
PERPLEXITY_MARGIN. The figures are printed and written to
$DSPARK_BUILD_DIR/oracle_reports/numerics_accuracy.json."""
import json
import os
import subprocess

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_map
from tokenizers import Tokenizer

from conftest import BUILD_DIR, SMOLLM2_GGUF, SOURCE_DIR, tool

WINDOW = 512
WINDOWS = 9
MLX_CHECKED = 96
MLX_LOGIT_BOUND = 5e-3
TOP1_MARGIN = 0.002
PERPLEXITY_MARGIN = 0.05



@pytest.fixture(scope="module")
def windows(smollm2):
    """Token windows of real prose: the corpus lines of 40+ characters, in file order."""
    lines = [json.loads(line) for line in
             (SOURCE_DIR / "tests/data/tokenizer_corpus.jsonl").read_text().splitlines()]
    text = "\n".join(line for line in lines if len(line) >= 40)
    ids = Tokenizer.from_file(str(smollm2 / "tokenizer.json")).encode(
        text, add_special_tokens=False).ids
    assert len(ids) >= WINDOW * WINDOWS
    return [ids[k * WINDOW:(k + 1) * WINDOW] for k in range(WINDOWS)]


def dspark_logits(smollm2, windows, work, numerics):
    steps = []
    for window in windows:
        steps += [{"op": "reset"}, {"op": "forward", "tokens": window, "logit_rows": "all"}]
    (work / "script.json").write_text(json.dumps({"steps": steps}))
    subprocess.run([tool("model"), str(smollm2), str(work / "script.json"), str(work)],
                   check=True, env=dict(os.environ, DSPARK_NUMERICS=numerics))
    return [work / f"step{2 * i + 1}_logits.npy" for i in range(len(windows))]


def log_softmax(logits):
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


class Figures:
    def __init__(self):
        self.kl, self.agree, self.nll = [], [], []

    def add(self, reference, logits, targets):
        ref, mine = log_softmax(reference[:-1]), log_softmax(logits[:-1])
        self.kl.append((np.exp(ref) * (ref - mine)).sum(axis=-1))
        self.agree.append(reference[:-1].argmax(axis=-1) == logits[:-1].argmax(axis=-1))
        self.nll.append(-mine[np.arange(len(targets)), targets])

    def summary(self):
        kl, agree, nll = (np.concatenate(v) for v in (self.kl, self.agree, self.nll))
        return {"positions": int(kl.size), "top1_agreement": float(agree.mean()),
                "mean_kl": float(kl.mean()), "max_kl": float(kl.max()),
                "perplexity": float(np.exp(nll.mean()))}


def test_int8_numerics_at_least_as_close_to_fp32_as_llama_cpp(smollm2, windows,
                                                              tmp_path_factory):
    from llama_cpp import Llama
    from mlx_lm.utils import load_model

    mx.set_default_device(mx.cpu)
    model, _ = load_model(smollm2)
    model.update(tree_map(lambda p: p.astype(mx.float32) if p.dtype in (mx.float16, mx.bfloat16)
                          else p, model.parameters()))
    llm = Llama(model_path=str(SMOLLM2_GGUF), n_ctx=WINDOW, n_batch=WINDOW, n_threads=2,
                n_threads_batch=2, logits_all=True, verbose=False)
    paths = {numerics: dspark_logits(smollm2, windows, tmp_path_factory.mktemp(numerics),
                                     numerics) for numerics in ("fp32", "int8")}
    first = np.load(paths["fp32"][0])[:MLX_CHECKED]
    mlx_first = np.array(model(mx.array([windows[0][:MLX_CHECKED]]))[0].astype(mx.float32))
    mlx_gap = float(np.abs(first - mlx_first).max())
    assert mlx_gap <= MLX_LOGIT_BOUND, f"dspark fp32 is {mlx_gap} logits off mlx-lm"
    figures = {name: Figures() for name in ("dspark int8", "llama.cpp")}
    for k, window in enumerate(windows):
        reference = np.load(paths["fp32"][k])
        targets = np.array(window[1:])
        llm.reset()
        llm.eval(window)
        figures["llama.cpp"].add(reference, np.array(llm.scores[:WINDOW], np.float32), targets)
        figures["dspark int8"].add(reference, np.load(paths["int8"][k]), targets)
    llm.close()
    reference_figures = Figures()
    for k, window in enumerate(windows):
        reference = np.load(paths["fp32"][k])
        reference_figures.add(reference, reference, np.array(window[1:]))
    report = {name: f.summary() for name, f in figures.items()}
    report["reference (dspark fp32)"] = reference_figures.summary()
    report["mlx-lm vs dspark fp32, max logit difference"] = mlx_gap
    print(json.dumps(report, indent=2))
    path = BUILD_DIR / "oracle_reports" / "numerics_accuracy.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")

    int8, llama = report["dspark int8"], report["llama.cpp"]
    assert int8["positions"] >= 4000
    assert int8["mean_kl"] > 0, "the int8 path gave the fp32 path's logits: is it running?"
    reference_perplexity = report["reference (dspark fp32)"]["perplexity"]
    assert int8["top1_agreement"] >= llama["top1_agreement"] - TOP1_MARGIN, report
    assert (abs(int8["perplexity"] - reference_perplexity)
            <= abs(llama["perplexity"] - reference_perplexity) + PERPLEXITY_MARGIN), report
    assert int8["mean_kl"] <= 1.05 * llama["mean_kl"], report
