"""The reasoning budget end to end (docs/server-api.md §3.5): `dspark serve` on the scripted tiny
nemotron_h of test_server_nemotron.py, asked through the official openai and anthropic SDKs.

The script reasons "plan" in three tokens after the prompt's `<think>\\n`, closes with `</think>`
and answers "\\n\\nSure.". A budget of 1 or 2 cuts the reasoning: the server must then emit the
forced ids ("\\n\\n" + message + "\\n</think>\\n\\n", tokenized by HF tokenizers here) and continue
exactly as mlx-lm's greedy decoding continues prompt + reasoning so far + forced ids."""
import json

import anthropic
import openai
import pytest
from tokenizers import Tokenizer

from test_server_nemotron import FIXTURE, QUESTION, REASONING, build_model, build_script, greedy, render
from test_server_sdk import KEY, LiveServer

MESSAGE = "Wrap up."


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    tokenizer = Tokenizer.from_file(str(FIXTURE / "tokenizer.json"))
    chain = build_script(tokenizer)
    out = tmp_path_factory.mktemp("budget") / "scripted"
    model = build_model(out, chain)
    prompt = tokenizer.encode(render(QUESTION), add_special_tokens=False).ids
    reasoning = chain[1:chain.index(tokenizer.token_to_id("</think>"))]
    assert tokenizer.decode(reasoning) == REASONING and len(reasoning) >= 3
    return dict(dir=out, model=model, tokenizer=tokenizer, chain=chain, prompt=prompt,
                reasoning=reasoning)


@pytest.fixture(scope="module")
def server(scripted):
    s = LiveServer(scripted["dir"])
    yield s
    s.stop()


def oa(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)


def forced_ids(tokenizer, message):
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False).ids  # noqa: E731
    head = encode("\n\n" + message + "\n") if message else encode("\n")
    return head + [tokenizer.token_to_id("</think>")] + encode("\n\n")


def expected(scripted, budget, message):
    """The generated ids with the budget firing after `budget` reasoning tokens: mlx-lm's greedy
    continuation after the forced ids, up to and including the end token."""
    tokenizer = scripted["tokenizer"]
    cut = scripted["reasoning"][:budget]
    forced = forced_ids(tokenizer, message)
    after = greedy(scripted["model"], scripted["prompt"] + cut + forced, 8)
    end = tokenizer.token_to_id("<|im_end|>")
    assert end in after, "mlx-lm does not end the answer"
    return cut, forced, after[:after.index(end) + 1]


def token_texts(tokenizer, ids):
    end = tokenizer.token_to_id("<|im_end|>")
    return [tokenizer.decode([i], skip_special_tokens=False) for i in ids if i != end]


@pytest.mark.parametrize("budget", [1, 2])
def test_budget_cuts_the_reasoning_and_continues_like_mlx_lm(server, scripted, budget):
    tokenizer = scripted["tokenizer"]
    cut, forced, after = expected(scripted, budget, MESSAGE)
    reply = oa(server).chat.completions.create(
        model="m", messages=QUESTION, temperature=0, max_tokens=40, logprobs=True,
        extra_body={"reasoning_budget": budget, "reasoning_budget_message": MESSAGE})
    choice = reply.choices[0]
    # Token for token: the cut reasoning, the forced ids, then mlx-lm's continuation.
    assert [t.token for t in choice.logprobs.content] == token_texts(tokenizer, cut + forced + after)
    assert reply.usage.completion_tokens == len(cut + forced + after)
    assert choice.message.model_extra["reasoning_content"] == tokenizer.decode(cut) + "\n\n" + MESSAGE
    assert choice.message.content == tokenizer.decode(after, skip_special_tokens=True).strip()
    assert choice.finish_reason == "stop"
    assert reply.model_extra["x_dspark"]["budget_forced"] is True

    chunks = list(oa(server).chat.completions.create(
        model="m", messages=QUESTION, temperature=0, max_tokens=40, stream=True,
        extra_body={"reasoning_budget": budget, "reasoning_budget_message": MESSAGE}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    streamed = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert streamed == choice.message.model_extra["reasoning_content"]
    assert "".join(d.content or "" for d in deltas) == choice.message.content


def test_budget_above_the_reasoning_changes_nothing(server, scripted):
    plain = oa(server).chat.completions.create(model="m", messages=QUESTION, temperature=0)
    roomy = oa(server).chat.completions.create(
        model="m", messages=QUESTION, temperature=0,
        extra_body={"reasoning_budget": len(scripted["reasoning"]) + 1})
    for reply in (plain, roomy):
        assert reply.choices[0].message.model_extra["reasoning_content"] == REASONING
        assert reply.choices[0].message.content == "Sure."
        assert reply.model_extra["x_dspark"]["budget_forced"] is False
    assert roomy.usage.completion_tokens == plain.usage.completion_tokens == len(scripted["chain"]) - 1


def test_empty_message_and_too_few_tokens_left(server, scripted):
    tokenizer = scripted["tokenizer"]
    cut, forced, after = expected(scripted, 1, "")
    reply = oa(server).chat.completions.create(
        model="m", messages=QUESTION, temperature=0, max_tokens=40, logprobs=True,
        extra_body={"reasoning_budget": 1, "reasoning_budget_message": ""})
    assert [t.token for t in reply.choices[0].logprobs.content] == token_texts(
        tokenizer, cut + forced + after)
    assert tokenizer.decode(forced, skip_special_tokens=False) == "\n</think>\n\n"
    # With fewer tokens left than forced ids the budget is skipped: the model reasons on and
    # closes the block itself.
    short = oa(server).chat.completions.create(
        model="m", messages=QUESTION, temperature=0,
        max_tokens=len(forced_ids(tokenizer, MESSAGE)),
        extra_body={"reasoning_budget": 1, "reasoning_budget_message": MESSAGE})
    assert short.model_extra["x_dspark"]["budget_forced"] is False
    assert short.choices[0].message.model_extra["reasoning_content"] == REASONING
    assert short.choices[0].message.content == "Sure."


def test_anthropic_budget_tokens_and_responses(server, scripted):
    tokenizer = scripted["tokenizer"]
    cut, _, after = expected(scripted, 2, "")
    client = anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)
    kwargs = dict(model="c", max_tokens=40, messages=QUESTION, extra_body={"temperature": 0})
    # thinking.budget_tokens is the reasoning budget (docs/server-api.md §2.2) ...
    cut_reply = client.messages.create(**kwargs, thinking={"type": "enabled", "budget_tokens": 2})
    assert [b.type for b in cut_reply.content] == ["thinking", "text"]
    assert cut_reply.content[0].thinking == tokenizer.decode(cut)
    assert cut_reply.content[1].text == tokenizer.decode(after, skip_special_tokens=True).strip()
    # ... unless the request's own reasoning_budget says otherwise.
    whole = client.messages.create(**dict(kwargs, extra_body={"temperature": 0, "reasoning_budget": 0}),
                                   thinking={"type": "enabled", "budget_tokens": 2})
    assert whole.content[0].thinking == REASONING

    responses = oa(server).responses.create(
        model="m", input="Weather in Paris?", temperature=0, max_output_tokens=40,
        extra_body={"reasoning_budget": 2, "reasoning_budget_message": MESSAGE})
    items = {item.type: item for item in responses.output}
    assert items["reasoning"].summary[0].text == tokenizer.decode(cut) + "\n\n" + MESSAGE
    assert responses.output_text == tokenizer.decode(after, skip_special_tokens=True).strip()
    assert responses.model_extra["x_dspark"]["budget_forced"] is True


@pytest.mark.parametrize("value", [-1, 1.5, True, "3"])
def test_bad_budgets_are_400(server, value):
    with pytest.raises(openai.BadRequestError, match="reasoning_budget"):
        oa(server).chat.completions.create(model="m", messages=QUESTION,
                                           extra_body={"reasoning_budget": value})
    status, body = server.post_raw("/v1/messages", json.dumps(
        {"model": "c", "max_tokens": 8, "messages": QUESTION, "reasoning_budget": value}).encode())
    assert status == 400 and "reasoning_budget" in body["error"]["message"]
    with pytest.raises(openai.BadRequestError, match="reasoning_budget_message"):
        oa(server).chat.completions.create(model="m", messages=QUESTION,
                                           extra_body={"reasoning_budget_message": 3})


def test_server_default_and_speculative_decoding(scripted):
    """--reasoning-budget is the default a request overrides (0 = off); lookup decoding (the
    speculative loop) gives the same tokens as plain decoding."""
    tokenizer = scripted["tokenizer"]
    cut, forced, after = expected(scripted, 2, "")
    for mode in ("baseline", "lookup"):
        s = LiveServer(scripted["dir"], "--reasoning-budget", "2", "--mode", mode)
        try:
            reply = oa(s).chat.completions.create(model="m", messages=QUESTION, temperature=0,
                                                  max_tokens=40, logprobs=True)
            off = oa(s).chat.completions.create(model="m", messages=QUESTION, temperature=0,
                                                extra_body={"reasoning_budget": 0})
        finally:
            s.stop()
        assert reply.model_extra["x_dspark"]["mode"] == mode
        assert [t.token for t in reply.choices[0].logprobs.content] == token_texts(
            tokenizer, cut + forced + after)
        assert reply.model_extra["x_dspark"]["budget_forced"] is True
        assert off.choices[0].message.model_extra["reasoning_content"] == REASONING
        assert off.model_extra["x_dspark"]["budget_forced"] is False


def test_budgets_under_load_answer_as_mlx_lm(scripted):
    """Eighteen concurrent requests with different budgets (1, 2, above the reasoning, off) on
    four slots, plain and lookup decoding: each answer is the one mlx-lm's greedy decoding gives it
    alone, token for token. The tiny model answers a request in a few milliseconds, so the
    requests are released together (a barrier) and are many, for the steps to carry several."""
    import threading

    tokenizer = scripted["tokenizer"]
    budgets = [1, 2, None, 0, 2, 1] * 3
    wanted = {}
    for budget in (1, 2):
        cut, forced, after = expected(scripted, budget, MESSAGE)
        wanted[budget] = token_texts(tokenizer, cut + forced + after)
    for mode in ("baseline", "lookup"):
        s = LiveServer(scripted["dir"], "--parallel", "4", "--mode", mode)
        replies = [None] * len(budgets)
        release = threading.Barrier(len(budgets))

        def ask(i, together=False):
            extra = {"reasoning_budget_message": MESSAGE}
            if budgets[i] is not None:
                extra["reasoning_budget"] = budgets[i]
            client = oa(s)
            if together:
                release.wait()
            replies[i] = client.chat.completions.create(
                model="m", messages=QUESTION, temperature=0, max_tokens=40, logprobs=True,
                extra_body=extra)

        try:
            alone = []
            for i in range(len(budgets)):
                ask(i)
                alone.append(replies[i])
            threads = [threading.Thread(target=ask, args=(i, True)) for i in range(len(budgets))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            widest = [line for line in s.get("/metrics").splitlines()
                      if line.startswith("dspark_batch_widest ")]
        finally:
            s.stop()
        assert float(widest[0].split()[1]) >= 2, widest
        for i, budget in enumerate(budgets):
            reply = replies[i]
            tokens = [t.token for t in reply.choices[0].logprobs.content]
            assert tokens == [t.token for t in alone[i].choices[0].logprobs.content], (mode, i)
            if budget in wanted:
                assert tokens == wanted[budget], (mode, i)
                assert reply.model_extra["x_dspark"]["budget_forced"] is True
            else:
                assert reply.choices[0].message.model_extra["reasoning_content"] == REASONING
                assert reply.model_extra["x_dspark"]["budget_forced"] is False
