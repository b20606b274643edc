"""dspark's token constraint (JSON grammar -> allowed token ids) gives the same allowed set as
llguidance, the independent reference, after every prefix of many token sequences.

llguidance compiles the same JSON schemas with the layout our grammars fix (json.dumps: ", " and
": ", no other whitespace, properties in declared order, additionalProperties false). Sequences
are json.dumps texts of valid values tokenized by HF tokenizers, plus random walks that pick
allowed tokens from llguidance's mask with a fixed seed (odd tokenizations, partial UTF-8 and
escapes). After each prefix the test compares the full masks, end-of-sequence id included, and
our complete() with llguidance's is_accepting(). Left out, each for a documented llguidance gap:
tokens holding U+007F or writing the escape \\/ (RFC 8259 allows both; llguidance cannot), tokens
over llguidance's 1024-byte limit, and llguidance's end id after the end (we allow nothing).
On a mismatch the message shows the prefix text and the tokens only one side allows."""
import json
import pathlib
import random
import subprocess

import jsonschema
import llguidance
import numpy as np
import pytest
from tokenizers import Tokenizer

from conftest import PUBLIC_FIXTURES, SOURCE_DIR, tool

# (name, tokenizer.json, end-of-sequence token)
TOKENIZERS = [
    ("smollm2", PUBLIC_FIXTURES / "smollm2" / "tokenizer.json", "<|im_end|>"),
    ("qwen3", PUBLIC_FIXTURES / "qwen3" / "tokenizer.json", "<|im_end|>"),
    ("nemotron-tiny", SOURCE_DIR / "tests" / "fixtures" / "nemotron-tiny" / "tokenizer.json",
     "<|im_end|>"),
]
# llguidance's token trie holds tokens of at most 1024 bytes (toktrie's PARENT_BITS); the
# nemotron-tiny fixture has longer ones (runs of spaces and of CJK text).
LLGUIDANCE_MAX_TOKEN_BYTES = 1024

LAYOUT = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
    # Our strings take any \uXXXX escape (surrogates paired), as JSON does.
    "json_allow_general_unicode_escapes": True,
}

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "score": {"type": "number"},
        "active": {"type": "boolean"},
        "nickname": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "color": {"enum": ["red", "green", "blue"]},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "integer"}},
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "score", "active", "tags", "color", "address"],
    "additionalProperties": False,
}

NULLABLE = {
    "type": "object",
    "properties": {
        "result": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "count": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "values": {"type": "array", "items": {"anyOf": [{"type": "number"}, {"type": "null"}]}},
    },
    "required": ["result", "count", "values"],
    "additionalProperties": False,
}

# (name, schema or None for json_object, valid values, json.dumps ensure_ascii for each value)
CASES = [
    ("json_object", None, [
        ({}, True),
        ({"a": 1, "b": [True, False, None], "c": {"d": -1.5e10, "e": "x\"y\\z\n\t/"}}, True),
        ({"text": "h\u00e9llo \u4e2d\u6587 \U0001f600", "nested": [[], {}, [1, [2.5]]]}, False),
        ({"text": "h\u00e9llo \u4e2d\u6587 \U0001f600", "n": -0.0, "big": 12345678901234567890},
         True),
        ({"control": "\u0001\u001f", "empty": "", "zero": 0, "neg": -7, "frac": 0.125}, True),
    ]),
    ("person", PERSON, [
        ({"name": "Ada Lovelace", "age": 36, "score": 99.5, "active": True, "tags": ["math"],
          "color": "green", "address": {"city": "London", "zip": 12345}}, True),
        ({"name": "Zo\u00eb \"Z\"", "age": -3, "score": 1e-07, "active": False,
          "nickname": "zz", "tags": [], "color": "red", "address": {"city": "", "zip": 0}},
         False),
        ({"name": "\u00c5ngstr\u00f6m", "age": 0, "score": -12, "active": True,
          "nickname": "", "tags": ["a", "b c", "\u00e9"], "color": "blue",
          "address": {"city": "Paris 5e", "zip": 75005}}, True),
    ]),
    ("nullable", NULLABLE, [
        ({"result": None, "count": None, "values": []}, True),
        ({"result": "ok", "count": 42, "values": [1.5, None, -2, 3e+20]}, True),
        ({"result": "\u2713 done", "count": -1, "values": [None, None]}, False),
    ]),
]

RANDOM_WALKS = 10
RANDOM_WALK_TOKENS = 64


def byte_level_chars():
    """GPT-2's ByteLevel alphabet: stand-in character -> byte."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


class ByteLevelVocabulary:
    """The token list llguidance's TokenizerWrapper takes, for a ByteLevel tokenizer.json, with
    tokens over llguidance's length limit cut short (the test leaves those ids out)."""

    def __init__(self, path, hf, eos_id):
        added = {t["id"]: t for t in json.loads(pathlib.Path(path).read_text())["added_tokens"]}
        chars = byte_level_chars()
        full = []
        for i in range(hf.get_vocab_size(with_added_tokens=True)):
            token = hf.id_to_token(i)
            full.append(added[i]["content"].encode() if i in added
                        else bytes(chars[c] for c in token))
        self.overlong = [i for i, t in enumerate(full) if len(t) > LLGUIDANCE_MAX_TOKEN_BYTES]
        self.tokens = [t[:LLGUIDANCE_MAX_TOKEN_BYTES] for t in full]
        # As llguidance's own tokenizer.json reader: added tokens written <...> are special too.
        self.special_token_ids = [i for i, t in added.items() if t["special"] or (
            t["content"].startswith("<") and t["content"].endswith(">"))]
        self.eos_token_id = eos_id
        self.bos_token_id = None
        self._hf = hf

    def __call__(self, text):
        text = text.decode() if isinstance(text, bytes) else text
        return self._hf.encode(text, add_special_tokens=False).ids


def llg_tokenizer(path, hf, eos_id):
    """llguidance's tokenizer and the ids whose masks it cannot give."""
    vocab = json.loads(pathlib.Path(path).read_text())["model"]["vocab"]
    if max(len(token) for token in vocab) <= LLGUIDANCE_MAX_TOKEN_BYTES:
        # llguidance reads the tokenizer.json itself.
        return llguidance.LLTokenizer(pathlib.Path(path).read_text(), eos_token=eos_id), []
    wrapped = ByteLevelVocabulary(path, hf, eos_id)
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(wrapped)), wrapped.overlong


def llg_matcher(tokenizer, schema):
    # no_forcing: where the grammar forces bytes, llguidance would otherwise allow only the
    # canonical token of those bytes; we allow every token that spells them.
    options = dict(schema if schema is not None else {"type": "object"}, **{"x-guidance": LAYOUT})
    lark = '%llguidance {"no_forcing": true}\nstart: %json ' + json.dumps(options) + "\n"
    matcher = llguidance.LLMatcher(tokenizer, llguidance.LLMatcher.grammar_from_lark(lark),
                                   log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return matcher


def llg_mask(matcher, vocab_size):
    bits = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8),
                         bitorder="little")
    assert not bits[vocab_size:].any(), "llguidance allows ids beyond the vocabulary"
    return bits[:vocab_size].astype(bool)


def wrap_up_candidates(tokenizer, matcher, candidates, rng):
    closing = [i for i in candidates
               if any(c in tokenizer.decode_bytes([i]) for c in b'"}]')
               and not any(c in tokenizer.decode_bytes([i]) for c in b"{[")]
    if not closing:
        return candidates
    finishing = []
    for i in rng.sample(closing, min(len(closing), 40)):
        probe = matcher.deep_copy()
        if probe.consume_token(i) and probe.is_accepting():
            finishing.append(i)
    return finishing or closing


def random_walk(tokenizer, schema, eos_id, vocab_size, rng):
    """Tokens picked at random from llguidance's mask."""
    matcher = llg_matcher(tokenizer, schema)
    ids = []
    while len(ids) < RANDOM_WALK_TOKENS and not matcher.is_stopped():
        allowed = np.nonzero(llg_mask(matcher, vocab_size))[0].tolist()
        if matcher.is_accepting() and rng.random() < 0.5:
            choice = eos_id
        else:
            candidates = [i for i in allowed if i != eos_id]
            if len(ids) >= RANDOM_WALK_TOKENS // 2:
                # Second half: head for the end, through tokens that close without opening.
                candidates = wrap_up_candidates(tokenizer, matcher, candidates, rng)
            elif len(candidates) > 200 and rng.random() < 0.35:
                closing = [i for i in candidates if b'"' in tokenizer.decode_bytes([i])]
                candidates = closing or candidates
            choice = rng.choice(candidates)
        ids.append(choice)
        assert matcher.consume_token(choice), matcher.get_error()
        if choice == eos_id:
            break
    if matcher.is_stopped() and ids[-1] != eos_id:
        # The text is whole and only the end may follow.
        ids.append(eos_id)
    return ids


def run_tool(tokenizer_path, schema, eos_id, sequences, tmp_path):
    request = tmp_path / "request.json"
    response = tmp_path / "response.json"
    request.write_text(json.dumps({"schema": schema, "end_ids": [eos_id], "sequences": sequences}))
    subprocess.run([tool("constrain"), str(tokenizer_path), str(request), str(response)],
                   check=True)
    return json.loads(response.read_text())


def token_list(tokenizer, ids, limit=8):
    shown = ", ".join(f"{i}:{tokenizer.decode_bytes([i])!r}" for i in ids[:limit])
    return shown + (f", ... ({len(ids)} in all)" if len(ids) > limit else "")


def writes_slash_escape(token, pending_escape):
    """Whether `token`, written after a backslash (pending_escape) or not, writes the escape \\/.
    RFC 8259 has it and so does our grammar; llguidance has no way to allow it."""
    for byte in token:
        if pending_escape:
            if byte == ord("/"):
                return True
            pending_escape = False
        elif byte == ord("\\"):
            pending_escape = True
    return False


class Ignored:
    """Ids left out of the comparison, for llguidance's documented gaps."""

    def __init__(self, tokenizer, vocab_size, overlong):
        tokens = [tokenizer.decode_bytes([i]) for i in range(vocab_size)]
        # RFC 8259 lets a string hold U+007F unescaped (json.dumps(ensure_ascii=False) writes it
        # so) and our grammar allows it; llguidance's string lexeme leaves it out.
        self.always = np.array([b"\x7f" in t for t in tokens])
        self.always[overlong] = True
        self.slash = [np.array([writes_slash_escape(t, pending) for t in tokens])
                      for pending in (False, True)]

    def after(self, prefix):
        trailing_backslashes = len(prefix) - len(prefix.rstrip(b"\\"))
        return self.always | self.slash[trailing_backslashes % 2]


def compare_sequence(tokenizer, schema, ids, ours, vocab_size, eos_id, ignored):
    """Mismatch descriptions for one sequence (empty when llguidance agrees at every prefix)."""
    problems = []
    matcher = llg_matcher(tokenizer, schema)
    for k in range(len(ours["masks"])):
        prefix = tokenizer.decode_bytes(ids[:k])
        got = np.unpackbits(np.frombuffer(bytes.fromhex(ours["masks"][k]), dtype=np.uint8),
                            bitorder="little")[:vocab_size].astype(bool)
        if k > 0 and ids[k - 1] == eos_id:
            # llguidance keeps allowing the end id after it; we allow nothing more.
            if got.any():
                problems.append(f"after {prefix!r}: dspark allows "
                                f"[{token_list(tokenizer, np.nonzero(got)[0].tolist())}]")
            expected = got
        else:
            expected = llg_mask(matcher, vocab_size)
        left_out = ignored.after(prefix)
        expected, got = expected & ~left_out, got & ~left_out
        if not np.array_equal(expected, got):
            only_llguidance = np.nonzero(expected & ~got)[0].tolist()
            only_dspark = np.nonzero(got & ~expected)[0].tolist()
            problems.append(f"after {prefix!r}: only llguidance allows "
                            f"[{token_list(tokenizer, only_llguidance)}]; "
                            f"only dspark allows [{token_list(tokenizer, only_dspark)}]")
        if ours["complete"][k] != matcher.is_accepting():
            problems.append(f"after {prefix!r}: dspark complete={ours['complete'][k]}, "
                            f"llguidance is_accepting={matcher.is_accepting()}")
        if k == len(ids) or problems:
            break
        assert matcher.consume_token(ids[k]), matcher.get_error()
    if ours["rejected_at"] is not None and not problems:
        k = ours["rejected_at"]
        problems.append(f"dspark refused {token_list(tokenizer, [ids[k]])} after "
                        f"{tokenizer.decode_bytes(ids[:k])!r}")
    return problems


def validate_text(text, schema):
    value = json.loads(text)
    assert isinstance(value, dict)
    if schema is not None:
        jsonschema.validate(value, schema)


@pytest.mark.parametrize("tokenizer_name,tokenizer_path,eos", TOKENIZERS,
                         ids=[t[0] for t in TOKENIZERS])
def test_masks_match_llguidance(tokenizer_name, tokenizer_path, eos, tmp_path):
    hf = Tokenizer.from_file(str(tokenizer_path))
    eos_id = hf.token_to_id(eos)
    vocab_size = hf.get_vocab_size(with_added_tokens=True)
    tokenizer, overlong = llg_tokenizer(tokenizer_path, hf, eos_id)
    rng = random.Random(f"constrain-{tokenizer_name}")
    ignored = Ignored(tokenizer, vocab_size, overlong)
    problems = []
    for case_name, schema, values in CASES:
        sequences = []
        for value, ensure_ascii in values:
            text = json.dumps(value, ensure_ascii=ensure_ascii)
            validate_text(text, schema)
            ids = hf.encode(text, add_special_tokens=False).ids
            assert tokenizer.decode_bytes(ids) == text.encode()
            sequences.append(ids + [eos_id])
        for _ in range(RANDOM_WALKS):
            ids = random_walk(tokenizer, schema, eos_id, vocab_size, rng)
            if ids and ids[-1] == eos_id:
                validate_text(tokenizer.decode_bytes(ids[:-1]).decode(), schema)
            sequences.append(ids)
        ours = run_tool(tokenizer_path, schema, eos_id, sequences, tmp_path)
        assert ours["vocab_size"] == vocab_size
        for ids, result in zip(sequences, ours["sequences"]):
            problems += [f"[{tokenizer_name} {case_name}] {problem}"
                         for problem in compare_sequence(tokenizer, schema, ids, result,
                                                         vocab_size, eos_id, ignored)]
    assert not problems, "\n".join(problems[:20])
