"""`dspark serve` end to end on a tiny nemotron_h (mlx-lm's model class) with the Nemotron tokenizer
and chat template (tests/fixtures/nemotron-tiny), through the official openai and anthropic SDKs:
thinking on and off and the hybrid prefix-cache checkpoints.

A random model never closes its reasoning, so the model is scripted: every mixer's
output projection is ~0, so the residual stream at the last layer is the current token's
embedding; script tokens have one-hot embeddings and lm_head row b is a large multiple of the
one-hot of a for each scripted step a -> b. Greedy decoding then follows the script, which
mlx-lm confirms before the server is asked. The small random remainder of the body still moves the
off-script logits, so the logprobs tell a wrong recurrent state apart."""
import importlib
import json
import shutil
import sys

import mlx.core as mx
import numpy as np
import openai
import anthropic
import pytest
from mlx.utils import tree_flatten, tree_unflatten
from tokenizers import Tokenizer

from conftest import SOURCE_DIR
from test_server_sdk import KEY, LiveServer

sys.path.insert(0, str(SOURCE_DIR / "scripts"))
import make_tiny_models  # noqa: E402

FIXTURE = SOURCE_DIR / "tests" / "fixtures" / "nemotron-tiny"
REASONING = "plan"
ANSWER = "\n\nSure."
QUESTION = [{"role": "user", "content": "Weather in Paris?"}]


def segment(tokenizer, text, used):
    """A tokenization of `text` that uses no id in `used` (depth-first, longest pieces first)."""
    pieces = {}
    for i in range(tokenizer.get_vocab_size()):
        pieces.setdefault(tokenizer.decode([i], skip_special_tokens=False), []).append(i)

    def search(at, taken):
        if at == len(text):
            return []
        for end in range(len(text), at, -1):
            for i in pieces.get(text[at:end], []):
                if i in taken:
                    continue
                rest = search(end, taken | {i})
                if rest is not None:
                    return [i] + rest
        return None

    ids = search(0, set(used))
    assert ids is not None, f"no tokenization of {text!r} with unused ids"
    return ids


def build_script(tokenizer):
    """The scripted ids: after `<think>\\n` (thinking on) the reasoning, `</think>`, then the answer;
    after `</think>` (thinking off: the prompt ends with it) the answer."""
    special = {t: tokenizer.token_to_id(t) for t in ("<think>", "</think>", "<|im_end|>")}
    newline = tokenizer.encode("<think>\n", add_special_tokens=False).ids[-1]
    used = set(special.values()) | {newline}
    reasoning = segment(tokenizer, REASONING, used)
    used |= set(reasoning)
    answer = segment(tokenizer, ANSWER, used)
    used |= set(answer)
    chain = [newline] + reasoning + [special["</think>"]] + answer + [special["<|im_end|>"]]
    assert len(set(chain)) == len(chain)
    return chain


def build_model(out, chain):
    config = dict(make_tiny_models.BASE_MODELS["nemotron_m"], vocab_size=8000)
    module = importlib.import_module("mlx_lm.models.nemotron_h")
    model = module.Model(module.ModelArgs.from_dict(config))
    make_tiny_models.randomize(model, 7)
    params = dict(tree_flatten(model.parameters()))
    for name in params:
        if name.endswith(("out_proj.weight", "o_proj.weight", "down_proj.weight", "fc2.weight")):
            params[name] = params[name] * 1e-3
    hidden = config["hidden_size"]
    rng = np.random.default_rng(7)
    # Off-script tokens live in the dimensions the script does not use; script tokens are one-hot.
    embed = np.zeros((8000, hidden), np.float32)
    embed[:, len(chain):] = rng.normal(size=(8000, hidden - len(chain)))
    head = rng.normal(size=(8000, hidden)).astype(np.float32) * 0.02
    head[:, : len(chain)] = 0.0
    for k, token in enumerate(chain):
        embed[token] = 0.0
        embed[token, k] = 1.0
        if k + 1 < len(chain):
            head[chain[k + 1], k] = 2.0
    params["backbone.embeddings.weight"] = mx.array(embed)
    params["lm_head.weight"] = mx.array(head)
    params["backbone.norm_f.weight"] = mx.ones((hidden,))
    model.update(tree_unflatten(list(params.items())))
    mx.eval(model.parameters())
    out.mkdir(parents=True)
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())),
                        metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURE / name, out / name)
    return model


def greedy(model, prompt, steps):
    ids = list(prompt)
    for _ in range(steps):
        logits = model(mx.array([ids]))[0, -1]
        ids.append(int(mx.argmax(logits).item()))
    return ids[len(prompt):]


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    tokenizer = Tokenizer.from_file(str(FIXTURE / "tokenizer.json"))
    chain = build_script(tokenizer)
    out = tmp_path_factory.mktemp("nemotron") / "scripted"
    model = build_model(out, chain)
    # mlx-lm itself follows the script from either prompt tail.
    prefix = tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>",
                              add_special_tokens=False).ids
    assert greedy(model, prefix + [chain[0]], len(chain) - 1) == chain[1:]
    closed = chain.index(tokenizer.token_to_id("</think>"))
    assert greedy(model, prefix + chain[closed:closed + 1], 3) == chain[closed + 1: closed + 4]
    return out, chain, tokenizer


@pytest.fixture(scope="module")
def server(scripted):
    s = LiveServer(scripted[0])
    yield s
    s.stop()


def oa(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)


def an(server):
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)


def test_openai_thinking_on_and_off(server, scripted):
    _, chain, tokenizer = scripted
    reply = oa(server).chat.completions.create(model="m", messages=QUESTION, temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.model_extra["reasoning_content"] == REASONING
    assert choice.message.content == "Sure."
    assert reply.usage.completion_tokens == len(chain) - 1
    # Reasoning counts the tokens up to and including the closer.
    assert reply.usage.completion_tokens_details.reasoning_tokens == chain.index(
        tokenizer.token_to_id("</think>"))

    chunks = list(oa(server).chat.completions.create(
        model="m", messages=QUESTION, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == REASONING
    assert "".join(d.content or "" for d in deltas) == "Sure."
    assert chunks[-1].usage.completion_tokens == reply.usage.completion_tokens

    off = oa(server).chat.completions.create(model="m", messages=QUESTION, temperature=0,
                                             reasoning_effort="none")
    assert (off.choices[0].message.model_extra or {}).get("reasoning_content") is None
    assert off.choices[0].message.content == "Sure."
    assert off.usage.completion_tokens_details.reasoning_tokens == 0


def test_anthropic_thinking_on_and_off(server):
    client = an(server)
    kwargs = dict(model="c", max_tokens=2000, messages=QUESTION,
                  thinking={"type": "enabled", "budget_tokens": 1024}, extra_body={"temperature": 0})
    whole = client.messages.create(**kwargs)
    assert whole.stop_reason == "end_turn"
    assert [b.type for b in whole.content] == ["thinking", "text"]
    assert whole.content[0].thinking == REASONING
    assert whole.content[1].text == "Sure."
    kinds = []
    with client.messages.stream(**kwargs) as stream:
        for event in stream:
            if event.type == "content_block_delta":
                kinds.append(event.delta.type)
        final = stream.get_final_message()
    assert "thinking_delta" in kinds and "text_delta" in kinds
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == REASONING and final.content[1].text == "Sure."
    assert final.usage.output_tokens == whole.usage.output_tokens
    off = client.messages.create(**dict(kwargs, thinking={"type": "disabled"}))
    assert [b.type for b in off.content] == ["text"] and off.content[0].text == "Sure."


def test_hybrid_prefix_cache_checkpoint(scripted, server):
    ask = dict(model="m", temperature=0, logprobs=True, top_logprobs=3)
    first = oa(server).chat.completions.create(messages=QUESTION, **ask)
    turn2 = QUESTION + [{"role": "assistant", "content": first.choices[0].message.content,
                         "reasoning_content": first.choices[0].message.model_extra["reasoning_content"]},
                        {"role": "user", "content": "And tomorrow?"}]
    second = oa(server).chat.completions.create(messages=turn2, **ask)
    cached = second.usage.prompt_tokens_details.cached_tokens
    # The checkpoint taken where the first prompt's history ends (before the generation prompt)
    # is reused: the second turn prefills only what follows it.
    gen_prompt = len(scripted[2].encode("<|im_start|>assistant\n<think>\n", add_special_tokens=False).ids)
    assert first.usage.prompt_tokens - gen_prompt <= cached < second.usage.prompt_tokens
    assert second.model_extra["x_dspark"]["cached_tokens"] == cached
    fresh = LiveServer(scripted[0], "--no-prefix-cache")
    try:
        again = oa(fresh).chat.completions.create(messages=turn2, **ask)
    finally:
        fresh.stop()
    assert again.usage.prompt_tokens_details.cached_tokens == 0
    assert again.choices[0].message.content == second.choices[0].message.content == "Sure."
    cached_lp = [[a.logprob for a in t.top_logprobs] for t in second.choices[0].logprobs.content]
    fresh_lp = [[a.logprob for a in t.top_logprobs] for t in again.choices[0].logprobs.content]
    assert np.allclose(cached_lp, fresh_lp, atol=1e-4)


def test_lookup_mode_passes_through(scripted, server):
    baseline = oa(server).chat.completions.create(model="m", messages=QUESTION, temperature=0)
    lookup = LiveServer(scripted[0], "--mode", "lookup")
    try:
        reply = oa(lookup).chat.completions.create(model="m", messages=QUESTION, temperature=0)
    finally:
        lookup.stop()
    stats = reply.model_extra["x_dspark"]
    assert stats["mode"] == "lookup" and baseline.model_extra["x_dspark"]["mode"] == "baseline"
    assert stats["target_forwards"] + stats["plain_steps"] >= 1
    assert stats["rounds"] >= stats["lookup_rounds"] >= 0
    assert reply.choices[0].message.content == baseline.choices[0].message.content
    assert reply.choices[0].message.model_extra["reasoning_content"] == REASONING
