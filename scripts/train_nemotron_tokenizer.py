#!/usr/bin/env python3
"""Trains tests/fixtures/nemotron-tiny/tokenizer.json: a small stand-in for the Nemotron 3 tokenizer
(whose 131072-token file is not available as a fixture) with the same structure (spec section 10.2):

- BPE with ignore_merges, no byte fallback, no normalizer;
- pre-tokenizer Sequence[Split(Tekken regex, Isolated), ByteLevel(add_prefix_space=False,
  use_regex=False)], ByteLevel decoder and post-processor;
- added tokens 0-999: <unk> <s> </s> [INST] [/INST] [AVAILABLE_TOOLS] [/AVAILABLE_TOOLS]
  [TOOL_RESULTS] [/TOOL_RESULTS] [TOOL_CALLS] <|im_start|> <|im_end|> (special), <think> </think>
  <tool_call> </tool_call> <tool_response> </tool_response> (not special), then <SPECIAL_18> ...
  <SPECIAL_999> (special).

Also writes tokenizer_config.json with the Nemotron 3 Nano chat template and eos <|im_end|>.
Deterministic: the trainer runs on the committed tokenizer corpus plus fixed generated text.
"""
import json
import pathlib
import random

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

ROOT = pathlib.Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "data" / "tokenizer_corpus.jsonl"
OUT_DIR = ROOT / "tests" / "fixtures" / "nemotron-tiny"
TEMPLATE = ROOT.parent / "shared" / "fixtures" / "templates" / "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.lf.jinja"

VOCAB_SIZE = 8000
TEKKEN_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
NAMED_TOKENS = [
    "<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "<|im_start|>", "<|im_end|>",
    "<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
]
NON_SPECIAL = {"<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
               "</tool_response>"}
ADDED_TOKENS = NAMED_TOKENS + [f"<SPECIAL_{i}>" for i in range(len(NAMED_TOKENS), 1000)]


def training_text():
    corpus = [json.loads(line) for line in CORPUS.read_text(encoding="ascii").splitlines()]
    rng = random.Random(1234)
    words = " ".join(corpus[:400]).split()
    generated = [" ".join(rng.choice(words) for _ in range(40)) for _ in range(3000)]
    return corpus + generated


def main():
    tokenizer = Tokenizer(models.BPE(ignore_merges=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(TEKKEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=ADDED_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_text(), trainer=trainer)

    document = json.loads(tokenizer.to_str())
    for entry in document["added_tokens"]:
        entry["normalized"] = False
        entry["special"] = entry["content"] not in NON_SPECIAL
        assert ADDED_TOKENS[entry["id"]] == entry["content"], entry
    document["model"]["ignore_merges"] = True
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "tokenizer.json").write_text(
        json.dumps(document, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": False,
        "add_eos_token": False,
        "bos_token": "<s>",
        "eos_token": "<|im_end|>",
        "unk_token": "<unk>",
        "pad_token": "<unk>",
        "model_max_length": 262144,
        "chat_template": TEMPLATE.read_text(encoding="utf-8"),
    }
    (OUT_DIR / "tokenizer_config.json").write_text(
        json.dumps(config, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    reloaded = Tokenizer.from_file(str(OUT_DIR / "tokenizer.json"))
    print(f"vocab {reloaded.get_vocab_size()}, written to {OUT_DIR}")


if __name__ == "__main__":
    main()
