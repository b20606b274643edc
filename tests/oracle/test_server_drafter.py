"""`dspark serve` with model drafters (--mode dspark / dflash / auto) through the official openai
SDK, on tiny random targets (scripts/make_tiny_models.py) and tiny random drafters
(scripts/make_tiny_drafters.py) given a byte-level BPE tokenizer of exactly the targets' 512 ids
and a ChatML template.

Speculative decoding is lossless: greedy answers (content and logprobs), streamed or not, equal the
baseline server's. The prefix cache keeps the drafter's context with the state, cut to the reused
prefix, so a second turn that hits the cache drafts exactly what a server without the cache
drafts: the same rounds, drafts and acceptances (with a fixed --max-draft; the calibrated cap
depends on timings), and the same seeded sampled answer, whose accept/resample draws follow the
drafts and their probabilities. The qwen3 target exercises the trim mode of the
cache, the hybrid nemotron_h one its checkpoint mode."""
import json
import random
import re
import shutil
import subprocess
import sys

import numpy as np
import openai
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from conftest import BUILD_DIR, SOURCE_DIR
from test_server_sdk import KEY, LiveServer

sys.path.insert(0, str(SOURCE_DIR / "scripts"))
import make_tiny_drafters  # noqa: E402
import make_tiny_models  # noqa: E402

CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WORDS = ("the a of to and in is it you that he was for on are with as his they be at one have this "
         "from or had by word but what some we can out other were all there when up use your how "
         "said an each she which do their time if will way about many then them write would like so "
         "these her long make thing see him two has look more day could go come did number sound no "
         "most people my over know water than call first who may down side been now find any new "
         "work part take get place made live where after back little only round man year came show "
         "every good me give our under name very through just form sentence great think say help "
         "low line differ turn cause much mean before move right boy old too same tell does set "
         "three want air well also play small end put home read hand port large spell add even land "
         "here must big high such follow act why ask men change went light kind off need house "
         "picture try us again animal point mother world near build self earth father").split()
QUESTION = [{"role": "user", "content": "What is the capital of France and why is it there?"}]
ASK = dict(model="m", temperature=0, max_tokens=24, logprobs=True, top_logprobs=3)
# target -> (its DSpark drafter, its DFlash drafter) from make_tiny_drafters.py
PAIRS = {"qwen3_tied": ("deepspec_a", "dflash_a"), "nemotron_attn": ("nemotron_a", "dflash_b")}


def train_tokenizer():
    rng = random.Random(0)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(12)) + rng.choice(".?!") for _ in range(400)]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=make_tiny_models.VOCAB, show_progress=False,
                                  special_tokens=["<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(corpus, trainer)
    assert tokenizer.get_vocab_size() == make_tiny_models.VOCAB
    return tokenizer


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """root/<target>/{model, model-DSpark, dspark, dflash}: `model-DSpark` is what --mode auto
    finds beside the model."""
    root = tmp_path_factory.mktemp("served")
    tokenizer = train_tokenizer()
    out = {}
    for target, (dspark, dflash) in PAIRS.items():
        built = make_tiny_models.build(target, root / "built")
        home = root / target
        model = home / "model"
        model.mkdir(parents=True)
        for name in ("config.json", "model.safetensors"):
            shutil.copy(built / name, model / name)
        tokenizer.save(str(model / "tokenizer.json"))
        (model / "tokenizer_config.json").write_text(json.dumps(
            {"chat_template": CHATML, "eos_token": "<|im_end|>", "bos_token": None}))
        drafters = {kind: make_tiny_drafters.build(name, root / "drafters")
                    for kind, name in (("dspark", dspark), ("dflash", dflash))}
        shutil.copytree(drafters["dspark"], home / "model-DSpark")
        out[target] = {"model": model, **drafters}
    return out


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


def served(model, *flags):
    return LiveServer(model, *flags)


def answer(server, messages, stream):
    """(content, [(token, logprob, [top logprobs])], x_dspark) of one greedy answer."""
    if not stream:
        reply = client(server).chat.completions.create(messages=messages, **ASK)
        choice = reply.choices[0]
        tokens = [(t.token, t.logprob, [a.logprob for a in t.top_logprobs])
                  for t in choice.logprobs.content]
        return choice.message.content, tokens, reply.model_extra["x_dspark"], reply.usage
    content, tokens, stats, usage = "", [], None, None
    for chunk in client(server).chat.completions.create(
            messages=messages, stream=True, stream_options={"include_usage": True}, **ASK):
        if chunk.model_extra.get("x_dspark"):
            stats = chunk.model_extra["x_dspark"]
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            content += choice.delta.content or ""
            if choice.logprobs and choice.logprobs.content:
                tokens += [(t.token, t.logprob, [a.logprob for a in t.top_logprobs])
                           for t in choice.logprobs.content]
    assert stats is not None, "the final chunk carries x_dspark"
    return content, tokens, stats, usage


def sampled(server, messages):
    """(content, x_dspark) of a seeded answer at temperature 1."""
    reply = client(server).chat.completions.create(model="m", messages=messages, max_tokens=24,
                                                   temperature=1.0, seed=7)
    return reply.choices[0].message.content, reply.model_extra["x_dspark"]


def assert_same_answer(ours, reference):
    assert ours[0] == reference[0]
    assert [t[0] for t in ours[1]] == [t[0] for t in reference[1]]
    assert np.allclose([t[1] for t in ours[1]], [t[1] for t in reference[1]], atol=1e-4)
    assert np.allclose([t[2] for t in ours[1]], [t[2] for t in reference[1]], atol=1e-4)


def assert_drafter_stats(stats, mode):
    assert stats["mode"] == mode
    assert stats["rounds"] >= 1 and stats["drafted"] >= stats["rounds"]
    assert 0 <= stats["accepted"] <= stats["drafted"]
    assert stats["target_forwards"] == stats["rounds"] + stats["plain_steps"] + 1
    assert len(stats["slot_acceptance"]) >= 1 and stats["cap"] >= 1
    for field in ("accept", "accept_len", "tok_s", "tokens_per_sec", "decode_tok_s",
                  "cached_tokens", "completion_tokens", "prefill_seconds", "ttft_seconds"):
        assert field in stats, field


DRAFT_FIELDS = ("rounds", "plain_steps", "drafted", "accepted", "slot_acceptance", "cap")


@pytest.mark.parametrize("target", sorted(PAIRS))
def test_drafter_modes_equal_baseline_and_cache_is_transparent(dirs, target):
    paths = dirs[target]
    model = paths["model"]
    baseline = served(model, "--mode", "baseline")
    try:
        reference = answer(baseline, QUESTION, stream=False)
        assert reference[2]["mode"] == "baseline"
        assert len(reference[1]) >= 4
    finally:
        baseline.stop()
    for mode in ("dspark", "dflash"):
        # A pinned cap and no prompt-lookup pre-step: which lookup drafts get verified follows the
        # costs this machine measures at load, so two servers could draft differently; the
        # pre-step's own greedy equality is test_auto_finds_the_drafter_beside_the_model's.
        flags = ("--mode", mode, "--drafter", str(paths[mode]), "--max-draft", "3",
                 "--no-lookup-drafts")
        cached = served(model, *flags)
        try:
            whole = answer(cached, QUESTION, stream=False)
            assert_same_answer(whole, reference)
            assert_drafter_stats(whole[2], mode)
            streamed = answer(cached, QUESTION, stream=True)
            assert_same_answer(streamed, reference)
            assert_drafter_stats(streamed[2], mode)
            turn2 = QUESTION + [{"role": "assistant", "content": whole[0]},
                                {"role": "user", "content": "And what of the river there?"}]
            second = answer(cached, turn2, stream=False)
            second_sampled = sampled(cached, turn2)
        finally:
            cached.stop()
        assert second[2]["cached_tokens"] > 0 and second_sampled[1]["cached_tokens"] > 0
        assert second[3].prompt_tokens_details.cached_tokens == second[2]["cached_tokens"]
        fresh = served(model, *flags, "--no-prefix-cache")
        try:
            again = answer(fresh, turn2, stream=False)
            again_sampled = sampled(fresh, turn2)
        finally:
            fresh.stop()
        assert again[2]["cached_tokens"] == 0
        assert_same_answer(second, again)
        # The drafter saw the same context with and without the cache, so it drafted the same:
        # the same rounds and acceptances, and when sampling (where the drafts and their
        # probabilities steer the accept/resample draws of the seeded generator) the same text.
        assert {f: second[2][f] for f in DRAFT_FIELDS} == {f: again[2][f] for f in DRAFT_FIELDS}
        assert second_sampled[1]["accepted"] > 0
        assert second_sampled[0] == again_sampled[0]
        assert ({f: second_sampled[1][f] for f in DRAFT_FIELDS}
                == {f: again_sampled[1][f] for f in DRAFT_FIELDS})


def test_auto_finds_the_drafter_beside_the_model(dirs, tmp_path, monkeypatch):
    # The calibration of the cap is measured at load and cached under XDG_CACHE_HOME.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    paths = dirs["qwen3_tied"]
    baseline = served(paths["model"], "--mode", "baseline", "--no-prefix-cache")
    try:
        reference = answer(baseline, QUESTION, stream=True)
    finally:
        baseline.stop()
    auto = served(paths["model"])
    try:
        health = json.loads(auto.get("/health"))
        streamed = answer(auto, QUESTION, stream=True)
    finally:
        auto.stop()
    assert health["mode"] == "dspark"
    assert_same_answer(streamed, reference)
    auto.log.seek(0)
    log = auto.log.read()
    assert "mode dspark: dspark drafter" in log and "model-DSpark found beside the model" in log
    assert (tmp_path / "cache" / "dspark" / "calibration.json").exists()
    # A dense target: prompt-lookup drafts are tried before the drafter's by default.
    assert health["lookup_drafts"] is True
    assert "prompt-lookup drafts tried before the drafter's" in log
    # The cap derived from this machine's costs: on a tiny target, where the drafter costs about
    # what a verify row does, plain steps (cap 0) may pay best at the reference depth. The
    # scheduler prices each round at the generation's own depth, where a short context makes
    # rows cheaper, so the drafter may still draft a round (and lookup drafts may too).
    cap = int(re.search(r"; cap (\d+)[ ,]", log)[1])
    stats = streamed[2]
    assert stats["cap"] == cap
    if cap == 0:
        assert "no cap pays" in log
        assert stats["target_forwards"] == stats["rounds"] + stats["plain_steps"] + 1
    else:
        assert_drafter_stats(stats, "dspark")


def test_bad_decoding_flags_are_refused(dirs):
    paths = dirs["qwen3_tied"]
    serve = [str(BUILD_DIR / "dspark"), "serve", "--model", str(paths["model"]), "--port", "0"]
    bad_cap = subprocess.run(serve + ["--max-draft", "many"], capture_output=True, text=True,
                             timeout=60)
    assert bad_cap.returncode != 0 and "--max-draft must be a number or 'auto'" in bad_cap.stderr
    wrong_family = subprocess.run(serve + ["--mode", "dflash", "--drafter", str(paths["dspark"])],
                                  capture_output=True, text=True, timeout=60)
    assert "--mode dflash needs a dflash drafter" in wrong_family.stderr
