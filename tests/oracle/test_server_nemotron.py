"""`dspark serve` end to end on a tiny nemotron_h (mlx-lm's model class) with the Nemotron tokenizer
and chat template (tests/fixtures/nemotron-tiny), through the official openai and anthropic SDKs:
thinking on and off, tool calls and the hybrid prefix-cache checkpoints.

A random model never closes its reasoning, so the model is scripted: every mixer's
output projection is ~0, so the residual stream at the last layer is the current token's
embedding; script tokens have one-hot embeddings and lm_head row b is a large multiple of the
one-hot of a for each scripted step a -> b. Greedy decoding then follows the script, which
mlx-lm confirms before the server is asked. The small random remainder of the body still moves the
off-script logits, so the logprobs tell a wrong recurrent state apart.

Tool calls: the Nemotron call format repeats pieces ("\n", "</parameter>\n"), which a one-token
script cannot follow, so the served tokenizer gains a few added tokens that spell the call in unique
pieces (HF tokenizers and dspark both honour added tokens). Whether `</think>` is followed by the
answer or by the call is decided by one attention head (nemotron_h attention has no positions):
its query fires only at `</think>`, its key singles out the `<tools>` token of the rendered tool
list, whose value pushes the call's first token past the answer's. A `<tool_response>` token in the
context has a higher key and no value, so after a tool result the model answers again."""
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
from tokenizers import AddedToken, Tokenizer

from conftest import SOURCE_DIR
from test_server_sdk import KEY, LiveServer

sys.path.insert(0, str(SOURCE_DIR / "scripts"))
import make_tiny_models  # noqa: E402
import test_chat_templates_jinja2 as jinja_env  # noqa: E402

FIXTURE = SOURCE_DIR / "tests" / "fixtures" / "nemotron-tiny"
REASONING = "plan"
ANSWER = "\n\nSure."
QUESTION = [{"role": "user", "content": "Weather in Paris?"}]
TOOLS_MARKER = "<tools>"
# The call <tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n... in
# pieces that each occur once.
CALL_PIECES = ["\n<function=get_weather>\n", "<parameter=city>\nParis\n</parameter>\n",
               "<parameter=days>\n3\n</parameter>\n", "</function>\n"]
CALL_ARGUMENTS = {"city": "Paris", "days": 3}
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "days": {"type": "integer", "description": "Days of forecast"}},
        "required": ["city"]}}}


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


def tool_tokenizer(path):
    """The fixture tokenizer plus the tool-list marker and the call pieces as added tokens."""
    tokenizer = Tokenizer.from_file(str(FIXTURE / "tokenizer.json"))
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False)
                          for t in [TOOLS_MARKER] + CALL_PIECES])
    tokenizer.save(str(path))
    return tokenizer


def build_tool_script(tokenizer):
    """The call's ids (emitted after `</think>` when the context holds the tool list) and the two
    context markers."""
    ids = [tokenizer.token_to_id(t) for t in ["<tool_call>"] + CALL_PIECES + ["</tool_call>"]]
    assert None not in ids
    return {"call": ids + [tokenizer.token_to_id("<|im_end|>")],
            "marker": tokenizer.token_to_id(TOOLS_MARKER),
            "response": tokenizer.token_to_id("<tool_response>"),
            "think_close": tokenizer.token_to_id("</think>")}


def build_model(out, chain, tools=None):
    """The scripted model of `chain`; with `tools` (build_tool_script's) also the call, served
    with the tokenizer saved at `tools["tokenizer"]`."""
    vocab = 8000 if tools is None else -(-Tokenizer.from_file(tools["tokenizer"]).get_vocab_size() // 64) * 64
    config = dict(make_tiny_models.BASE_MODELS["nemotron_m"], vocab_size=vocab)
    module = importlib.import_module("mlx_lm.models.nemotron_h")
    model = module.Model(module.ModelArgs.from_dict(config))
    make_tiny_models.randomize(model, 7)
    params = dict(tree_flatten(model.parameters()))
    for name in params:
        if name.endswith(("out_proj.weight", "o_proj.weight", "down_proj.weight", "fc2.weight")):
            params[name] = params[name] * 1e-3
    hidden = config["hidden_size"]
    # Script dimensions: one per script token, then (with tools) the attention head's signal.
    dims = {token: k for k, token in enumerate(chain)}
    steps = list(zip(chain, chain[1:]))
    if tools is not None:
        call = tools["call"]
        for token in call + [tools["marker"], tools["response"]]:
            dims.setdefault(token, len(dims))
        steps += list(zip(call, call[1:]))
        signal = len(dims)
    used = len(dims) + (tools is not None)
    rng = np.random.default_rng(7)
    # Off-script tokens live in the dimensions the script does not use; script tokens are one-hot.
    embed = np.zeros((vocab, hidden), np.float32)
    embed[:, used:] = rng.normal(size=(vocab, hidden - used))
    head = rng.normal(size=(vocab, hidden)).astype(np.float32) * 0.02
    head[:, :used] = 0.0
    for token, k in dims.items():
        embed[token] = 0.0
        embed[token, k] = 1.0
    for a, b in steps:
        head[b, dims[a]] = 2.0
    if tools is not None:
        head[call[0], signal] = 4.0
        wire_tool_head(params, config, dims, tools, signal)
    params["backbone.embeddings.weight"] = mx.array(embed)
    params["lm_head.weight"] = mx.array(head)
    params["backbone.norm_f.weight"] = mx.ones((hidden,))
    model.update(tree_unflatten(list(params.items())))
    mx.eval(model.parameters())
    out.mkdir(parents=True)
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())),
                        metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    shutil.copy(FIXTURE / "tokenizer_config.json", out / "tokenizer_config.json")
    shutil.copy(FIXTURE / "tokenizer.json" if tools is None else tools["tokenizer"],
                out / "tokenizer.json")
    return model


def wire_tool_head(params, config, dims, tools, signal):
    """Attention head 0 of the attention layer: at `</think>` it reads the `<tools>` marker into the
    signal dimension unless a `<tool_response>` outbids it. Heads 0 and 1 share key/value head 0,
    so head 1's first output column is silenced too."""
    layer = config["hybrid_override_pattern"].index("*")
    prefix = f"backbone.layers.{layer}."
    head_dim = config["head_dim"]
    # The pre-norm scales a one-hot row to sqrt(hidden); scores are q.k / sqrt(head_dim).
    unit = config["hidden_size"] ** 0.5
    q = np.array(params[prefix + "mixer.q_proj.weight"])
    k = np.array(params[prefix + "mixer.k_proj.weight"])
    v = np.array(params[prefix + "mixer.v_proj.weight"])
    o = np.array(params[prefix + "mixer.o_proj.weight"])
    q[:head_dim] = 0.0
    k[:head_dim] = 0.0
    v[:head_dim] = 0.0
    o[:, 0] = 0.0
    o[:, head_dim] = 0.0
    q[0, dims[tools["think_close"]]] = 1.0
    to_score = head_dim ** 0.5 / unit ** 2
    k[0, dims[tools["marker"]]] = 25.0 * to_score
    k[0, dims[tools["response"]]] = 40.0 * to_score
    v[0, dims[tools["marker"]]] = 1.0
    o[signal, 0] = 1.0 / unit
    for name, value in (("q_proj", q), ("k_proj", k), ("v_proj", v), ("o_proj", o)):
        params[prefix + "mixer." + name + ".weight"] = mx.array(value)
    params[prefix + "norm.weight"] = mx.ones((config["hidden_size"],))


def greedy(model, prompt, steps):
    ids = list(prompt)
    for _ in range(steps):
        logits = model(mx.array([ids]))[0, -1]
        ids.append(int(mx.argmax(logits).item()))
    return ids[len(prompt):]


def render(messages, tools=None, **kwargs):
    """The prompt as transformers renders it (the jinja2 oracle's environment)."""
    source = json.loads((FIXTURE / "tokenizer_config.json").read_text())["chat_template"]
    return jinja_env.ENV.from_string(source).render(
        messages=messages, tools=tools, add_generation_prompt=True, **kwargs)


def tool_turn(arguments):
    """The question, the model's call and the tool's answer, as OpenAI history."""
    return QUESTION + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"}]


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    root = tmp_path_factory.mktemp("nemotron")
    tokenizer = tool_tokenizer(root / "tokenizer.json")
    chain = build_script(tokenizer)
    tools = dict(build_tool_script(tokenizer), tokenizer=str(root / "tokenizer.json"))
    out = root / "scripted"
    model = build_model(out, chain, tools)
    # mlx-lm itself follows the script from either prompt tail.
    prefix = tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>",
                              add_special_tokens=False).ids
    assert greedy(model, prefix + [chain[0]], len(chain) - 1) == chain[1:]
    closed = chain.index(tokenizer.token_to_id("</think>"))
    assert greedy(model, prefix + chain[closed:closed + 1], 3) == chain[closed + 1: closed + 4]
    # ... and calls the tool when the prompt lists it, thinking on and off, but answers the result.
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False).ids  # noqa: E731
    call = tools["call"]
    with_tools = encode(render(QUESTION, [WEATHER_TOOL]))
    assert greedy(model, with_tools, closed + len(call)) == chain[1:closed + 1] + call
    off = encode(render(QUESTION, [WEATHER_TOOL], enable_thinking=False))
    assert greedy(model, off, len(call)) == call
    answered = encode(render(tool_turn(CALL_ARGUMENTS), [WEATHER_TOOL], enable_thinking=False))
    assert greedy(model, answered, len(chain) - closed - 1) == chain[closed + 1:]
    return out, chain, tokenizer


@pytest.fixture(scope="module")
def server(scripted):
    s = LiveServer(scripted[0], "--mode", "baseline")
    yield s
    s.stop()


def oa(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)


def an(server):
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)


def stream_deltas(client, kwargs):
    """The content_block_delta kinds of an Anthropic stream, and its final message."""
    with client.messages.stream(**kwargs) as stream:
        kinds = [e.delta.type for e in stream if e.type == "content_block_delta"]
        return kinds, stream.get_final_message()


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
    kinds, final = stream_deltas(client, kwargs)
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


def test_openai_tool_calls(server, scripted):
    _, chain, tokenizer = scripted
    closed = chain.index(tokenizer.token_to_id("</think>"))
    ask = dict(model="m", messages=QUESTION, tools=[WEATHER_TOOL], temperature=0)
    reply = oa(server).chat.completions.create(**ask)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.model_extra["reasoning_content"] == REASONING
    assert not choice.message.content
    [call] = choice.message.tool_calls
    assert call.id.startswith("call_") and len(call.id) == len("call_") + 24
    assert call.type == "function" and call.function.name == "get_weather"
    # XML parameter values arrive typed by the tool's schema: days is an integer.
    assert json.loads(call.function.arguments) == CALL_ARGUMENTS
    assert reply.usage.completion_tokens == closed + len(CALL_PIECES) + 3
    prompt = tokenizer.encode(render(QUESTION, [WEATHER_TOOL]), add_special_tokens=False).ids
    assert reply.usage.prompt_tokens == len(prompt)

    chunks = list(oa(server).chat.completions.create(**ask, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    parts = [t for d in deltas for t in d.tool_calls or []]
    assert {t.index for t in parts} == {0}
    assert [t.id for t in parts if t.id] == [parts[0].id] and parts[0].id.startswith("call_")
    assert "".join(t.function.name or "" for t in parts) == "get_weather"
    assert json.loads("".join(t.function.arguments or "" for t in parts)) == CALL_ARGUMENTS
    assert "".join(d.content or "" for d in deltas) == ""
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"

    off = oa(server).chat.completions.create(**ask, reasoning_effort="none")
    assert (off.choices[0].message.model_extra or {}).get("reasoning_content") is None
    assert json.loads(off.choices[0].message.tool_calls[0].function.arguments) == CALL_ARGUMENTS

    # The tool's answer goes back as history (arguments as the JSON string the SDK returned):
    # the template sees them as an object, and the model answers.
    turn2 = tool_turn(call.function.arguments)
    answer = oa(server).chat.completions.create(model="m", messages=turn2, tools=[WEATHER_TOOL],
                                                temperature=0)
    assert answer.choices[0].finish_reason == "stop"
    assert answer.choices[0].message.content == "Sure."
    assert not answer.choices[0].message.tool_calls
    prompt = tokenizer.encode(render(tool_turn(CALL_ARGUMENTS), [WEATHER_TOOL]),
                              add_special_tokens=False).ids
    assert answer.usage.prompt_tokens == len(prompt)


ANTHROPIC_TOOL = {"name": "get_weather", "description": WEATHER_TOOL["function"]["description"],
                  "input_schema": WEATHER_TOOL["function"]["parameters"]}


def test_anthropic_tool_use(server, scripted):
    tokenizer = scripted[2]
    client = an(server)
    kwargs = dict(model="c", max_tokens=200, messages=QUESTION, tools=[ANTHROPIC_TOOL],
                  thinking={"type": "enabled", "budget_tokens": 1024},
                  extra_body={"temperature": 0})
    whole = client.messages.create(**kwargs)
    assert whole.stop_reason == "tool_use"
    assert [b.type for b in whole.content] == ["thinking", "tool_use"]
    use = whole.content[1]
    assert use.name == "get_weather" and use.input == CALL_ARGUMENTS
    assert use.id.startswith("toolu_")
    kinds, final = stream_deltas(client, kwargs)
    assert "input_json_delta" in kinds and "thinking_delta" in kinds
    assert final.stop_reason == "tool_use"
    assert [b.type for b in final.content] == ["thinking", "tool_use"]
    assert final.content[1].input == CALL_ARGUMENTS and final.content[1].name == "get_weather"

    # count_tokens is the tokenizer's count of the prompt the template renders.
    count = client.messages.count_tokens(model="c", messages=QUESTION, tools=[ANTHROPIC_TOOL],
                                         thinking={"type": "enabled", "budget_tokens": 1024})
    prompt = tokenizer.encode(render(QUESTION, [WEATHER_TOOL]), add_special_tokens=False).ids
    assert count.input_tokens == len(prompt) == whole.usage.input_tokens + (
        whole.usage.cache_read_input_tokens or 0)

    history = QUESTION + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name,
                                           "input": use.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                      "content": "Sunny, 21 C"}]}]
    answer = client.messages.create(**dict(kwargs, messages=history, thinking={"type": "disabled"}))
    assert answer.stop_reason == "end_turn"
    assert [b.type for b in answer.content] == ["text"] and answer.content[0].text == "Sure."


def test_tool_choice(server, scripted):
    tokenizer = scripted[2]
    other = {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string"}}}}}
    client = oa(server)
    # A named function keeps only that tool in the prompt.
    named = client.chat.completions.create(
        model="m", messages=QUESTION, tools=[other, WEATHER_TOOL], temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert named.usage.prompt_tokens == len(
        tokenizer.encode(render(QUESTION, [WEATHER_TOOL]), add_special_tokens=False).ids)
    assert json.loads(named.choices[0].message.tool_calls[0].function.arguments) == CALL_ARGUMENTS
    single = client.chat.completions.create(model="m", messages=QUESTION, tools=[WEATHER_TOOL],
                                            temperature=0, parallel_tool_calls=False)
    assert len(single.choices[0].message.tool_calls) == 1
    assert single.choices[0].finish_reason == "tool_calls"
    # "none" renders the tools but parses no call: the model's text comes back as content.
    none = client.chat.completions.create(model="m", messages=QUESTION, tools=[WEATHER_TOOL],
                                          temperature=0, tool_choice="none")
    assert none.choices[0].finish_reason == "stop" and not none.choices[0].message.tool_calls
    assert "<function=get_weather>" in none.choices[0].message.content
    assert none.usage.prompt_tokens == named.usage.prompt_tokens
    for bad in ({"type": "function", "function": {"name": "nope"}}, "sometimes"):
        with pytest.raises(openai.BadRequestError, match="tool_choice"):
            client.chat.completions.create(model="m", messages=QUESTION, tools=[WEATHER_TOOL],
                                           tool_choice=bad)
    # After the tool's answer the model would reply in text; "required" and a named function
    # force the opening of a call where the answer starts (after </think> with thinking on, at
    # the first token with it off) and the model writes the rest.
    turn2 = tool_turn(json.dumps(CALL_ARGUMENTS))
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        for effort in ("medium", "none"):
            forced = client.chat.completions.create(
                model="m", messages=turn2, tools=[WEATHER_TOOL], temperature=0,
                tool_choice=choice, reasoning_effort=effort)
            assert forced.choices[0].finish_reason == "tool_calls", (choice, effort)
            [call] = forced.choices[0].message.tool_calls
            assert call.function.name == "get_weather"
            assert json.loads(call.function.arguments) == CALL_ARGUMENTS
            thought = (forced.choices[0].message.model_extra or {}).get("reasoning_content")
            assert thought == (REASONING if effort == "medium" else None)
    anthropic_any = an(server).messages.create(
        model="c", max_tokens=200,
        messages=QUESTION + [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1",
                                               "name": "get_weather", "input": CALL_ARGUMENTS}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                          "content": "Sunny, 21 C"}]}],
        tools=[ANTHROPIC_TOOL], tool_choice={"type": "any"}, extra_body={"temperature": 0})
    assert anthropic_any.stop_reason == "tool_use"
    assert anthropic_any.content[-1].input == CALL_ARGUMENTS
    with pytest.raises(anthropic.BadRequestError, match="tool_choice"):
        an(server).messages.create(model="c", max_tokens=20, messages=QUESTION,
                                   tools=[ANTHROPIC_TOOL], tool_choice={"type": "tool", "name": "x"})


def test_responses_function_calls(server, scripted):
    tokenizer = scripted[2]
    tool = dict(WEATHER_TOOL["function"], type="function")
    client = oa(server)
    ask = dict(model="m", input="Weather in Paris?", tools=[tool], temperature=0)
    whole = client.responses.create(**ask)
    [call] = [item for item in whole.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == CALL_ARGUMENTS
    assert call.call_id.startswith("call_")
    events = list(client.responses.create(**ask, stream=True))
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [json.loads(i.arguments) for i in done if i.type == "function_call"] == [CALL_ARGUMENTS]
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert json.loads(deltas) == CALL_ARGUMENTS
    assert events[-1].type == "response.completed"
    # The call and its output go back as input items; the model answers.
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"type": "function_call", "call_id": call.call_id, "name": call.name,
                "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"}]
    answer = client.responses.create(model="m", input=history, tools=[tool], temperature=0)
    assert answer.output_text == "Sure."
    prompt = tokenizer.encode(render(tool_turn(CALL_ARGUMENTS), [WEATHER_TOOL]),
                              add_special_tokens=False).ids
    assert answer.usage.input_tokens == len(prompt)
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        client.responses.create(**ask, tool_choice={"type": "function", "name": "nope"})


def test_logit_bias(server, scripted):
    _, chain, tokenizer = scripted
    client = oa(server)
    favoured = chain[2]
    reply = client.chat.completions.create(
        model="m", messages=QUESTION, temperature=0, max_tokens=3, reasoning_effort="none",
        logit_bias={str(favoured): 100}, logprobs=True)
    tokens = [t.token for t in reply.choices[0].logprobs.content]
    assert tokens == [tokenizer.decode([favoured], skip_special_tokens=False)] * 3
    assert reply.choices[0].finish_reason == "length"
    # A bias against the scripted answer's first token moves greedy decoding off the script.
    answer_start = chain[chain.index(tokenizer.token_to_id("</think>")) + 1]
    off = client.chat.completions.create(model="m", messages=QUESTION, temperature=0, max_tokens=4,
                                         reasoning_effort="none",
                                         logit_bias={str(answer_start): -100})
    assert off.choices[0].message.content != "Sure."
    for bad in ({"x": 1}, {"5": 500}, {str(10**6): 1}):
        with pytest.raises(openai.BadRequestError, match="logit_bias"):
            client.chat.completions.create(model="m", messages=QUESTION, logit_bias=bad)


def test_special_tokens_stay_out_of_the_text(server, scripted):
    """A special token the model writes (here forced by logit_bias) is not shown, as vLLM's and
    llama-server's defaults; vLLM's skip_special_tokens: false spells it out. HF decodes the same
    ids both ways as the oracle."""
    _, _, tokenizer = scripted
    client = oa(server)
    im_start = tokenizer.token_to_id("<|im_start|>")
    ask = dict(model="m", messages=QUESTION, temperature=0, max_tokens=3, reasoning_effort="none",
               logit_bias={str(im_start): 100}, logprobs=True)
    hidden = client.chat.completions.create(**ask)
    assert [t.token for t in hidden.choices[0].logprobs.content] == ["<|im_start|>"] * 3
    assert hidden.choices[0].message.content == tokenizer.decode([im_start] * 3,
                                                                 skip_special_tokens=True) == ""
    assert hidden.choices[0].finish_reason == "length"
    shown = client.chat.completions.create(**ask, extra_body={"skip_special_tokens": False})
    assert shown.choices[0].message.content == tokenizer.decode(
        [im_start] * 3, skip_special_tokens=False) == "<|im_start|>" * 3
    # A stop string that spells the skipped token still stops there.
    stopped = client.chat.completions.create(**ask, stop=["<|im_start|>"])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].message.content == ""
    assert stopped.usage.completion_tokens == 1
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in
                       client.chat.completions.create(**ask, stream=True) if chunk.choices)
    assert streamed == ""
    raw = client.completions.create(model="m", prompt="Hi", max_tokens=2, temperature=0,
                                    logit_bias={str(im_start): 100})
    assert raw.choices[0].text == ""
    with pytest.raises(openai.BadRequestError, match="skip_special_tokens"):
        client.chat.completions.create(model="m", messages=QUESTION,
                                       extra_body={"skip_special_tokens": "no"})


def test_health_describes_the_engine(server):
    health = json.loads(server.get("/health"))
    assert health["status"] == "ok" and health["architecture"] == "nemotron_h"
    assert health["mode"] == "baseline"
    # The Nemotron template thinks between <think> markers and takes no reasoning_effort.
    assert health["supports_reasoning_budget"] is True
    assert health["supports_reasoning_effort"] is False
    assert health["thinking_default"] is True and health["reasoning_budget"] == 0
