#!/usr/bin/env python3
"""Runs llama.cpp's own convert_hf_to_gguf.py on a checkpoint whose tokenizer is Tekken-structured
but not a vocabulary llama.cpp knows, such as the ones scripts/make_reduced_nemotron_hf.py writes.

    convert_hf_to_gguf_tekken.py LLAMA_CPP_DIR  <convert_hf_to_gguf.py arguments...>

The converter names a BPE tokenizer's pre-tokenizer (`tokenizer.ggml.pre`) by hashing the token
ids of a fixed text, so it recognises only vocabularies listed in its table; the real Nemotron-3
Nano vocabulary (131072 tokens, Mistral-Nemo's) is there as "tekken", but the 8,000-token
Nemotron-structured stand-in (tests/fixtures/nemotron-tiny) cannot be: its ids differ. This wrapper
checks that the checkpoint's tokenizer.json pre-tokenizer is exactly the Tekken one (a Split on the
regex that llama.cpp's LLAMA_VOCAB_PRE_TYPE_TEKKEN quotes as its source, Isolated, then ByteLevel
without its own regex) and only then answers "tekken" in place of the hash lookup; everything
else is the converter's own code, unchanged.
"""

import json
import runpy
import sys
from pathlib import Path

TEKKEN_REGEX = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def is_tekken(tokenizer_json):
    pre = json.loads(Path(tokenizer_json).read_text())["pre_tokenizer"]
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else []
    return (len(steps) == 2 and steps[0].get("type") == "Split"
            and steps[0].get("pattern", {}).get("Regex") == TEKKEN_REGEX
            and steps[0].get("behavior") == "Isolated" and not steps[0].get("invert")
            and steps[1].get("type") == "ByteLevel" and steps[1].get("use_regex") is False
            and steps[1].get("add_prefix_space") is False)


def main():
    llama_cpp, args = Path(sys.argv[1]), sys.argv[2:]
    model = next(a for a in args if not a.startswith("-") and Path(a).is_dir())
    if not is_tekken(Path(model) / "tokenizer.json"):
        sys.exit(f"{model}/tokenizer.json: the pre-tokenizer is not Tekken's; run the converter "
                 "itself")
    sys.path.insert(0, str(llama_cpp))
    sys.path.insert(1, str(llama_cpp / "gguf-py"))
    from conversion import base

    known = base.TextModel.get_vocab_base_pre

    def vocab_base_pre(self, tokenizer):
        try:
            return known(self, tokenizer)
        except NotImplementedError:
            base.logger.warning("pre-tokenizer hash not in llama.cpp's table; tokenizer.json's "
                                "pre-tokenizer is Tekken's: tokenizer.ggml.pre = tekken")
            return "tekken"

    base.TextModel.get_vocab_base_pre = vocab_base_pre
    sys.argv = [str(llama_cpp / "convert_hf_to_gguf.py"), *args]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
