"""`dspark serve --parallel 4` under concurrent load, through the official openai and anthropic
SDKs: eight requests of mixed lengths and settings (stop strings, a JSON constraint, logprobs, a
seeded sampled answer, a stream, a long prompt, the Anthropic route) sent at once answer exactly
what each answers alone, content, tokens and logprobs, in every decoding mode: plain, lookup, and
the DSpark and DFlash drafters on a hybrid nemotron_h and a qwen3 target. The slots' forwards
share steps (/metrics counts them), and a row's result does not depend on the rows beside it, so
batching never changes an answer."""
import random
import threading
import time

import anthropic
import openai
import pytest

from test_server_drafter import dirs  # noqa: F401  (the tiny targets and drafters)
from test_server_sdk import KEY, LiveServer, rss_bytes

LONG = " ".join(f"item {i} is number {i * 7 % 13}." for i in range(60))


def requests_for(json_ok):
    """(route, arguments) of the eight requests."""
    ask = [{"role": "user", "content": "Tell me about the sea and the ships on it."}]
    out = [
        ("chat", dict(messages=ask, max_tokens=40, temperature=0)),
        ("chat", dict(messages=[{"role": "user", "content": "Name three colors, please."}],
                      max_tokens=30, temperature=0, stop=[".", "\n\n"])),
        ("chat", dict(messages=[{"role": "user", "content": "Count from one to ten."}],
                      max_tokens=24, temperature=1.0, seed=11)),
        ("chat", dict(messages=[{"role": "user", "content": "What is two plus two?"}],
                      max_tokens=20, temperature=0, logprobs=True, top_logprobs=3)),
        ("stream", dict(messages=[{"role": "user", "content": "Write a short poem."}],
                        max_tokens=36, temperature=0)),
        ("chat", dict(messages=[{"role": "user", "content": LONG + " Which item is first?"}],
                      max_tokens=12, temperature=0)),
        ("anthropic", dict(messages=[{"role": "user", "content": "Say hello to the team."}],
                           max_tokens=28)),
    ]
    if json_ok:
        out.append(("chat", dict(messages=[{"role": "user", "content": "Give me a JSON object."}],
                                 max_tokens=40, temperature=0,
                                 response_format={"type": "json_object"})))
    else:
        out.append(("chat", dict(messages=ask, max_tokens=18, temperature=0, stop=["the"])))
    return out


def run(server, route, args, ready=None):
    """One request's answer; with `ready` (a threading.Barrier) it is sent once every thread
    holding the barrier has its client built, so that the requests arrive together."""
    if route == "anthropic":
        client = anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=300)
        if ready is not None:
            ready.wait()
        reply = client.messages.create(model="m", extra_body={"temperature": 0}, **args)
        return ("".join(b.text for b in reply.content), reply.stop_reason,
                reply.usage.output_tokens)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=300)
    if ready is not None:
        ready.wait()
    if route == "stream":
        content, finish = "", None
        for chunk in client.chat.completions.create(model="m", stream=True, **args):
            for choice in chunk.choices:
                content += choice.delta.content or ""
                finish = choice.finish_reason or finish
        return content, finish
    reply = client.chat.completions.create(model="m", **args)
    choice = reply.choices[0]
    logprobs = None
    if choice.logprobs and choice.logprobs.content:
        logprobs = [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs])
                    for t in choice.logprobs.content]
    return choice.message.content, choice.finish_reason, reply.usage.completion_tokens, logprobs


def metric(server, name):
    for line in server.get("/metrics").splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {name} in /metrics")


def check_concurrent_equals_alone(server, json_ok=True):
    requests = requests_for(json_ok)
    alone = [run(server, route, args) for route, args in requests]
    steps_before = metric(server, "dspark_batch_steps_total")
    forwards_before = metric(server, "dspark_batch_sequence_forwards_total")
    together = [None] * len(requests)
    errors = []
    ready = threading.Barrier(len(requests))

    def worker(i):
        try:
            together[i] = run(server, *requests[i], ready=ready)
        except Exception as e:  # reported below, with the request
            errors.append((i, e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for i, (ours, reference) in enumerate(zip(together, alone)):
        assert ours == reference, f"request {i} ({requests[i][0]}) changed under load"
    steps = metric(server, "dspark_batch_steps_total") - steps_before
    forwards = metric(server, "dspark_batch_sequence_forwards_total") - forwards_before
    # Requests overlapped: steps carried several sequences at once.
    assert forwards > 1.5 * steps, (forwards, steps)
    assert metric(server, "dspark_batch_widest") >= 3
    assert metric(server, "dspark_slots") == 4
    # Every state lives in the pool: the 4 slots' sequences and the prefix cache's (default 2).
    assert metric(server, "dspark_state_pool_capacity") == 6
    assert 1 <= metric(server, "dspark_state_pool_sequences") <= 6
    assert metric(server, "dspark_state_pool_bytes") > 0
    check_batch_histogram(server)


def check_batch_histogram(server):
    """The sequences-per-step histogram adds up to the step and sequence-forward totals."""
    assert metric(server, "dspark_batch_sequences_count") == metric(server, "dspark_batch_steps_total")
    assert metric(server, 'dspark_batch_sequences_bucket{le="+Inf"}') == \
        metric(server, "dspark_batch_steps_total")
    assert metric(server, "dspark_batch_sequences_sum") == \
        metric(server, "dspark_batch_sequence_forwards_total")
    buckets = [metric(server, f'dspark_batch_sequences_bucket{{le="{b}"}}')
               for b in (1, 2, 4, 8, 16, 32)]
    assert buckets == sorted(buckets)


def check_slot_metrics(server, slots):
    """The per-slot series name only real slots, their tokens add up to the server's total, each
    slot's histograms hold at most its requests, and the load spread over several slots."""
    text = server.get("/metrics")
    requests, tokens = {}, {}
    for line in text.splitlines():
        for name, into in (("dspark_slot_requests_total", requests),
                           ("dspark_slot_generated_tokens_total", tokens)):
            if line.startswith(name + '{slot="'):
                into[int(line.split('"')[1])] = float(line.split()[1])
    assert set(requests) == set(tokens) and set(requests) <= set(range(slots)), requests
    assert len(requests) >= 4, requests
    assert sum(tokens.values()) == metric(server, "dspark_generated_tokens_total")
    for slot, count in requests.items():
        for histogram in ("dspark_slot_time_per_output_token_seconds",
                          "dspark_slot_time_to_first_token_seconds"):
            observed = metric(server, f'{histogram}_count{{slot="{slot}"}}')
            assert observed == metric(server, f'{histogram}_bucket{{slot="{slot}",le="+Inf"}}')
            assert 0 < observed <= count, (histogram, slot, observed, count)


# Caps are pinned (lookup's --max-draft, a drafter's without the lookup pre-step): the seeded
# sampled request then draws what it draws alone, where load-aware caps verify other drafts under
# load (the same distribution, other tokens).
@pytest.mark.parametrize("mode", ["baseline", "lookup"])
def test_default_model_under_load_answers_as_alone(smollm2, mode):
    pinned = ("--max-draft", "6") if mode == "lookup" else ()
    server = LiveServer(smollm2, "--parallel", "4", "--mode", mode, *pinned)
    try:
        check_concurrent_equals_alone(server)
    finally:
        server.stop()


@pytest.mark.parametrize("target,kind", [("nemotron_attn", "dspark"), ("qwen3_tied", "dflash")])
def test_model_drafters_under_load_answer_as_alone(dirs, target, kind):  # noqa: F811
    entry = dirs[target]
    server = LiveServer(entry["model"], "--parallel", "4", "--mode", kind, "--drafter",
                        str(entry[kind]), "--max-draft", "3", "--no-lookup-drafts")
    try:
        check_concurrent_equals_alone(server, json_ok=target == "qwen3_tied")
    finally:
        server.stop()


QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def dialect_answer(server, kind, disconnect=False):
    """One 8-token greedy answer in dialect `kind`; None when the client cut the stream."""
    oa = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=300)
    an = anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=300)
    if disconnect:
        if kind == "anthropic":
            with an.messages.stream(model="m", max_tokens=8, messages=QUESTION,
                                    extra_body={"temperature": 0}) as stream:
                next(iter(stream))
        else:
            stream = oa.chat.completions.create(model="m", messages=QUESTION, max_tokens=8,
                                                temperature=0, stream=True)
            next(iter(stream))
            stream.close()
        return None
    if kind == "chat":
        r = oa.chat.completions.create(model="m", messages=QUESTION, max_tokens=8, temperature=0)
        return r.choices[0].message.content, r.choices[0].finish_reason
    if kind == "completions":
        r = oa.completions.create(model="m", prompt="The capital of France is", max_tokens=8,
                                  temperature=0)
        return r.choices[0].text, r.choices[0].finish_reason
    if kind == "responses":
        r = oa.responses.create(model="m", input="What is the capital of France?",
                                max_output_tokens=16, temperature=0)
        return r.output_text, r.status
    r = an.messages.create(model="m", max_tokens=8, messages=QUESTION, extra_body={"temperature": 0})
    return "".join(b.text for b in r.content), r.stop_reason


def test_32_clients_on_8_slots_with_disconnects_in_every_dialect(smollm2):
    """32 clients x 4 requests over the OpenAI chat, completions and Responses routes and the
    Anthropic route, a quarter of them streams the client cuts after the first event, on
    --parallel 8: every finished answer is the one the request gets alone, the metrics (per slot
    too) add up, and RSS stays flat."""
    kinds = ["chat", "completions", "responses", "anthropic"]
    server = LiveServer(smollm2, "--parallel", "8")
    try:
        expected = {kind: dialect_answer(server, kind) for kind in kinds}
        rss_before = rss_bytes(server.proc.pid)
        errors, finished, cut = [], [0], [0]
        lock = threading.Lock()

        def client(seed):
            rng = random.Random(seed)
            for _ in range(4):
                kind = rng.choice(kinds)
                disconnect = kind in ("chat", "anthropic") and rng.random() < 0.25
                try:
                    got = dialect_answer(server, kind, disconnect)
                except Exception as e:  # noqa: BLE001 - every failure is a test failure
                    with lock:
                        errors.append((kind, repr(e)))
                    continue
                with lock:
                    if disconnect:
                        cut[0] += 1
                    elif got != expected[kind]:
                        errors.append((kind, got, expected[kind]))
                    else:
                        finished[0] += 1

        threads = [threading.Thread(target=client, args=(i,)) for i in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[:5]
        assert finished[0] + cut[0] == 128 and cut[0] > 0
        # Cancelled streams end their jobs; nothing is left waiting or running.
        deadline = time.time() + 30
        while time.time() < deadline and (metric(server, "dspark_requests_running") or
                                          metric(server, "dspark_requests_waiting")):
            time.sleep(0.1)
        assert metric(server, "dspark_requests_running") == 0
        assert metric(server, "dspark_requests_waiting") == 0
        assert metric(server, "dspark_prefill_tokens_total") == 0
        # Finished and cancelled generations alike gave their pool sequences back: only the
        # prefix cache's (at most its 2 slots) stay open.
        while time.time() < deadline and metric(server, "dspark_state_pool_sequences") > 2:
            time.sleep(0.1)
        assert 1 <= metric(server, "dspark_state_pool_sequences") <= 2
        assert metric(server, "dspark_state_pool_capacity") == 10
        assert metric(server, "dspark_batch_widest") >= 4
        check_batch_histogram(server)
        check_slot_metrics(server, 8)
        rss_after = rss_bytes(server.proc.pid)
        assert rss_after - rss_before < 96 * 2**20 + rss_before // 4, (rss_before, rss_after)
        assert {kind: dialect_answer(server, kind) for kind in kinds} == expected
    finally:
        server.stop()
