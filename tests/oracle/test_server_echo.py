"""Prompt scoring through /v1/completions (`echo` with `logprobs`, token-id prompts), the request
lm-evaluation-harness sends for its log-likelihood tasks, on the default model through the
official openai SDK.

- Self-consistency, exact: a prompt row's logits are a decode step's bit for bit (the kernels are
  row invariant), so echoing a prompt followed by a greedy continuation must give that
  continuation's tokens exactly the log-probs and alternatives the generation reported.
- Against mlx-lm float32 (the independent oracle), on dspark's fp32 path: every echoed log-prob
  within 1e-2 of mlx-lm's log-softmax of the same ids. test_default_model.py bounds the two
  engines' mean-centered logits by 5e-3 on every CPU; a log-prob adds the normaliser's
  difference, itself within that bound, hence 2 x 5e-3.
"""
import mlx.core as mx
import numpy as np
import openai
import pytest
from mlx.utils import tree_map
from tokenizers import Tokenizer

from test_server_sdk import LiveServer, oa

PROMPTS = ["def fibonacci(n):\n    ", "Once upon a time", "The three primary colors are"]
LOGPROB_BOUND = 1e-2


@pytest.fixture(scope="module")
def tokenizer(smollm2):
    return Tokenizer.from_file(str(smollm2 / "tokenizer.json"))


@pytest.fixture(scope="module")
def server(smollm2):
    s = LiveServer(smollm2)
    yield s
    s.stop()


def test_echoed_continuation_has_the_generations_logprobs_exactly(server, tokenizer):
    client = oa(server)
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt).ids
        generated = client.completions.create(model="m", prompt=ids, max_tokens=24,
                                              temperature=0, logprobs=3)
        text = generated.choices[0].text
        steps = generated.choices[0].logprobs
        whole = tokenizer.encode(prompt + text).ids
        echo = client.completions.create(model="m", prompt=whole, max_tokens=1, temperature=0,
                                         logprobs=3, echo=True)
        choice = echo.choices[0]
        assert choice.text.startswith(prompt + text)
        scored = choice.logprobs
        assert len(scored.tokens) == len(whole) + 1
        assert scored.token_logprobs[0] is None and scored.top_logprobs[0] is None
        n = len(ids)
        # The re-encoded text holds the generated tokens (the same strings, so the same ids).
        assert scored.tokens[n:n + 24] == steps.tokens
        assert scored.token_logprobs[n:n + 24] == steps.token_logprobs
        assert scored.top_logprobs[n:n + 24] == steps.top_logprobs
        assert echo.usage.prompt_tokens == len(whole)
        # A text prompt scores the same as its ids.
        as_text = client.completions.create(model="m", prompt=prompt + text, max_tokens=1,
                                            temperature=0, logprobs=3, echo=True)
        assert as_text.choices[0].logprobs.token_logprobs == scored.token_logprobs


def test_echo_without_logprobs_prefixes_the_prompt(server):
    client = oa(server)
    plain = client.completions.create(model="m", prompt="Once upon", max_tokens=6, temperature=0)
    echo = client.completions.create(model="m", prompt="Once upon", max_tokens=6, temperature=0,
                                     echo=True)
    assert echo.choices[0].text == "Once upon" + plain.choices[0].text
    assert echo.choices[0].logprobs is None


def test_bad_prompts_and_echo_with_stream_are_400(server, tokenizer):
    client = oa(server)
    cases = [
        (dict(prompt=[1, 2, 10**7]), "vocabulary"),
        (dict(prompt=[[1, 2], [3]]), "one prompt"),
        (dict(prompt=["a", "b"]), "one prompt"),
        (dict(prompt=[]), "'prompt' must be"),
        (dict(prompt=[1, -2]), "not a token id"),
        (dict(prompt="x", echo=True, stream=True), "stream"),
    ]
    for fields, words in cases:
        with pytest.raises(openai.BadRequestError, match=words):
            client.completions.create(model="m", max_tokens=1, **fields)


def test_echoed_logprobs_match_mlx_lm_float32(smollm2, tokenizer):
    from mlx_lm.utils import load_model

    mx.set_default_device(mx.cpu)
    model, _ = load_model(smollm2)
    model.update(tree_map(lambda p: p.astype(mx.float32) if p.dtype in (mx.float16, mx.bfloat16)
                          else p, model.parameters()))
    s = LiveServer(smollm2, "--numerics", "fp32")
    try:
        client = oa(s)
        for prompt in PROMPTS:
            ids = tokenizer.encode(prompt + " and then some more words to score here").ids
            scored = client.completions.create(model="m", prompt=ids, max_tokens=1,
                                               temperature=0, logprobs=1, echo=True)
            ours = np.array(scored.choices[0].logprobs.token_logprobs[1:len(ids)])
            logits = np.array(model(mx.array([ids]))[0].astype(mx.float32))
            shifted = logits - logits.max(axis=-1, keepdims=True)
            log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
            theirs = log_probs[np.arange(len(ids) - 1), ids[1:]]
            assert np.abs(ours - theirs).max() <= LOGPROB_BOUND, (prompt, ours - theirs)
    finally:
        s.stop()
