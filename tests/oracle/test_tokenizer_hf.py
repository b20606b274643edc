"""dspark's tokenizer against HF tokenizers on the committed corpus (tests/data/tokenizer_corpus.jsonl):
identical ids with and without special tokens, identical decoded text with and without skipping
special tokens, streaming decoding that adds up to the full decoding, and tokenizer.json files
written by dspark (from a tokenizer.json or from GGUF metadata) that HF loads to the same
encodings.

Tokenizers: the real Qwen3 and SmolLM2 files, the Nemotron-structured nemotron-tiny fixture, and
three small ones trained here to cover the other layouts: SentencePiece-style BPE with byte
fallback (Llama 2 layout), Metaspace pre-tokenization, and GPT-2 ByteLevel with a prefix space,
NFKC + lowercase and added tokens using lstrip / rstrip / single_word / normalized."""
import json
import pathlib
import random
import subprocess

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
from tokenizers import processors, trainers

from conftest import PUBLIC_FIXTURES, SOURCE_DIR, tool

CORPUS = [json.loads(line) for line in
          (SOURCE_DIR / "tests" / "data" / "tokenizer_corpus.jsonl").read_text("ascii").splitlines()]


def train_small(tmp_dir: pathlib.Path, name: str, tokenizer: Tokenizer, trainer) -> str:
    tokenizer.train_from_iterator(CORPUS, trainer=trainer)
    path = tmp_dir / f"{name}.json"
    tokenizer.save(str(path))
    return str(path)


def llama2_style(tmp_dir):
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tokenizer.decoder = decoders.Sequence([
        decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
        decoders.Strip(" ", 1, 0)])
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=1500, show_progress=False,
                                  special_tokens=["<unk>", "<s>", "</s>"] + byte_tokens)
    return train_small(tmp_dir, "llama2_style", tokenizer, trainer)


def metaspace_style(tmp_dir):
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=True)
    tokenizer.decoder = decoders.Sequence([
        decoders.Metaspace(prepend_scheme="first"), decoders.ByteFallback(), decoders.Fuse()])
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=1500, show_progress=False,
                                  special_tokens=["<unk>", "<s>", "</s>"] + byte_tokens)
    path = train_small(tmp_dir, "metaspace_style", tokenizer, trainer)
    tokenizer = Tokenizer.from_file(path)
    tokenizer.add_special_tokens([AddedToken("<|im_start|>", special=True),
                                  AddedToken("<|im_end|>", special=True)])
    tokenizer.save(path)
    return path


def gpt2_style(tmp_dir):
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 1))
    trainer = trainers.BpeTrainer(vocab_size=1200, show_progress=False,
                                  special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    path = train_small(tmp_dir, "gpt2_style", tokenizer, trainer)
    tokenizer = Tokenizer.from_file(path)
    tokenizer.add_special_tokens([
        AddedToken("<|im_end|>", special=True, lstrip=True, rstrip=True),
        AddedToken("<think>", special=True, single_word=True),
    ])
    tokenizer.add_tokens([
        AddedToken("</think>", special=False, normalized=True),
        AddedToken("Hello", special=False, normalized=True, single_word=True),
        AddedToken(" world", special=False, normalized=False, rstrip=True),
    ])
    tokenizer.save(path)
    return path


FIXTURES = {
    "qwen3": lambda tmp: str(PUBLIC_FIXTURES / "qwen3" / "tokenizer.json"),
    "smollm2": lambda tmp: str(PUBLIC_FIXTURES / "smollm2" / "tokenizer.json"),
    "nemotron_tiny": lambda tmp: str(SOURCE_DIR / "tests" / "fixtures" / "nemotron-tiny" / "tokenizer.json"),
    "llama2_style": llama2_style,
    "metaspace_style": metaspace_style,
    "gpt2_style": gpt2_style,
}


def run_tool(tmp_dir: pathlib.Path, tokenizer_path: str, request: dict) -> dict:
    request_path = tmp_dir / "request.json"
    response_path = tmp_dir / "response.json"
    request_path.write_text(json.dumps(request))
    subprocess.run([tool("tokenizer"), "run", tokenizer_path, str(request_path),
                    str(response_path)], check=True)
    return json.loads(response_path.read_text(encoding="utf-8"))


def assert_all_equal(name, expected, actual, inputs):
    assert len(expected) == len(actual), name
    bad = [i for i, (e, a) in enumerate(zip(expected, actual)) if e != a]
    details = "\n".join(f"  input {inputs[i]!r:.200}\n    hf     {expected[i]!r:.300}\n"
                        f"    dspark {actual[i]!r:.300}" for i in bad[:5])
    assert not bad, f"{name}: {len(bad)} of {len(expected)} differ\n{details}"


def encodings(hf: Tokenizer, texts, add_special_tokens):
    return [e.ids for e in hf.encode_batch(texts, add_special_tokens=add_special_tokens)]


@pytest.fixture(scope="module")
def tmp_module(tmp_path_factory):
    return tmp_path_factory.mktemp("tokenizer")


@pytest.mark.parametrize("name", list(FIXTURES))
def test_matches_hf_on_corpus(name, tmp_module):
    path = FIXTURES[name](tmp_module)
    hf = Tokenizer.from_file(path)
    expected_plain = encodings(hf, CORPUS, False)
    expected_special = encodings(hf, CORPUS, True)

    vocab = hf.get_vocab_size()
    rng = random.Random(5)
    random_ids = [[rng.randrange(vocab + 8) for _ in range(rng.randint(1, 30))] for _ in range(300)]
    decode_inputs = expected_special + random_ids
    stream_inputs = expected_special[:600] + random_ids

    got = run_tool(tmp_module, path, {"encode": CORPUS, "decode": decode_inputs,
                                      "stream": stream_inputs})
    assert_all_equal(f"{name} ids", expected_plain, got["ids"], CORPUS)
    assert_all_equal(f"{name} ids with special tokens", expected_special, got["ids_special"], CORPUS)
    for skip, key in [(True, "decode_skip"), (False, "decode_keep")]:
        expected = hf.decode_batch(decode_inputs, skip_special_tokens=skip)
        assert_all_equal(f"{name} {key}", expected, got[key], decode_inputs)
    expected_stream = hf.decode_batch(stream_inputs, skip_special_tokens=False)
    assert_all_equal(f"{name} streamed text", expected_stream,
                     ["".join(chunks) for chunks in got["stream_chunks"]], stream_inputs)

    assert got["vocab_size"] == vocab
    special = sorted(i for i, t in hf.get_added_tokens_decoder().items() if t.special)
    assert got["special_ids"] == special


def test_nemotron_tiny_config_ids(tmp_module):
    path = SOURCE_DIR / "tests" / "fixtures" / "nemotron-tiny" / "tokenizer.json"
    got = run_tool(tmp_module, str(path), {"encode": ["<think>x</think>"]})
    assert got["eos_id"] == 11 and got["bos_id"] == 1
    assert got["ids"][0][0] == 12 and got["ids"][0][-1] == 13
    assert 12 not in got["special_ids"] and 11 in got["special_ids"]


@pytest.mark.parametrize("name", ["qwen3", "smollm2", "nemotron_tiny", "llama2_style",
                                  "gpt2_style"])
def test_written_tokenizer_json_loads_in_hf(name, tmp_module):
    path = FIXTURES[name](tmp_module)
    out = tmp_module / f"{name}.rewritten.json"
    subprocess.run([tool("tokenizer"), "rewrite", path, str(out)], check=True)
    original = Tokenizer.from_file(path)
    rewritten = Tokenizer.from_file(str(out))
    for add_special in (False, True):
        assert_all_equal(f"{name} rewritten", encodings(original, CORPUS, add_special),
                         encodings(rewritten, CORPUS, add_special), CORPUS)


def gguf_fields(hf_path: str, pre: str, bos: str, eos: str, add_bos: bool) -> dict:
    """The tokenizer.ggml.* fields that llama.cpp's converter writes for this tokenizer.json."""
    document = json.loads(pathlib.Path(hf_path).read_text(encoding="utf-8"))
    hf = Tokenizer.from_file(hf_path)
    size = hf.get_vocab_size()
    tokens = [hf.id_to_token(i) for i in range(size)]
    added = hf.get_added_tokens_decoder()
    token_types = [(3 if added[i].special else 4) if i in added else 1 for i in range(size)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in document["model"]["merges"]]
    return {"model": "gpt2", "pre": pre, "tokens": tokens, "token_types": token_types,
            "merges": merges, "bos_id": hf.token_to_id(bos), "eos_id": hf.token_to_id(eos),
            "add_bos": add_bos, "add_eos": False}


@pytest.mark.parametrize("name,pre,bos,eos", [
    ("smollm2", "smollm", "<|im_start|>", "<|im_end|>"),
    ("qwen3", "qwen2", "<|endoftext|>", "<|im_end|>"),
    ("nemotron_tiny", "tekken", "<s>", "<|im_end|>"),
])
def test_tokenizer_json_from_gguf_metadata(name, pre, bos, eos, tmp_module):
    path = FIXTURES[name](tmp_module)
    fields_path = tmp_module / f"{name}.gguf.json"
    fields_path.write_text(json.dumps(gguf_fields(path, pre, bos, eos, add_bos=False)))
    out = tmp_module / f"{name}.from_gguf.json"
    subprocess.run([tool("tokenizer"), "gguf", str(fields_path), str(out)], check=True)
    original = Tokenizer.from_file(path)
    converted = Tokenizer.from_file(str(out))
    for add_special in (False, True):
        assert_all_equal(f"{name} from GGUF", encodings(original, CORPUS, add_special),
                         encodings(converted, CORPUS, add_special), CORPUS)
    ids = encodings(original, CORPUS, True)
    assert_all_equal(f"{name} from GGUF decode", original.decode_batch(ids),
                     converted.decode_batch(ids), ids)


def test_gguf_add_bos_puts_bos_first(tmp_module):
    path = FIXTURES["smollm2"](tmp_module)
    fields_path = tmp_module / "smollm2.bos.gguf.json"
    fields = gguf_fields(path, "smollm", "<|im_start|>", "<|im_end|>", add_bos=True)
    fields_path.write_text(json.dumps(fields))
    out = tmp_module / "smollm2.bos.json"
    subprocess.run([tool("tokenizer"), "gguf", str(fields_path), str(out)], check=True)
    converted = Tokenizer.from_file(str(out))
    assert converted.encode("hi").ids[0] == fields["bos_id"]
    assert converted.encode("hi", add_special_tokens=False).ids[0] != fields["bos_id"]
