#!/usr/bin/env python3
"""Writes tests/data/tokenizer_corpus.jsonl: the strings on which dspark's tokenizer is compared
with HF tokenizers. Deterministic (fixed seed, no network): rerunning it reproduces the file.

Each line is one JSON string. The mix aims at the places where tokenizers disagree: many scripts,
code, emoji sequences, whitespace runs of every kind, special-token strings and near misses,
contractions, digits of many scripts, sequences that Unicode normalization changes, random bytes
decoded with errors="replace", random assigned code points, and long strings.
"""
import json
import pathlib
import random
import sys
import unicodedata

SEED = 20240611
OUT = pathlib.Path(__file__).resolve().parents[1] / "tests" / "data" / "tokenizer_corpus.jsonl"

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! How are you doing today?",
    "I've been told he's there; they'll see if we'd go, you're sure I'm right?",
    "DON'T SHOUT, IT'S LATE. We'Ve a'lL 'RE 'M 'D 'S 'T 'LL 'VE",
    "Der schnelle braune Fuchs springt über den faulen Hund. Äpfel, Öl, Übermut, Straße.",
    "Le cœur a ses raisons que la raison ne connaît point. Où est l'hôtel ? À bientôt !",
    "El niño comió piñata en la mañana; ¿qué pasó? ¡Olé!",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "нещо на Български, Україна, Беларусь, Српски језик",
    "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Καλημέρα κόσμε!",
    "العربية لغة جميلة، وهذا نص تجريبي مع أرقام ١٢٣٤٥.",
    "עברית היא שפה שמית. שלום עולם!",
    "हिन्दी एक भारतीय भाषा है। नमस्ते दुनिया १२३",
    "বাংলা ভাষা সুন্দর। আমি তোমাকে ভালোবাসি।",
    "தமிழ் ஒரு செம்மொழி. வணக்கம் உலகம்!",
    "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ สวัสดีชาวโลก",
    "中文没有空格分词。你好，世界！今天天气很好。",
    "日本語の文章にはひらがなとカタカナと漢字が混ざります。こんにちは世界！",
    "한국어 문장은 띄어쓰기를 합니다. 안녕하세요 세계!",
    "Tiếng Việt có nhiều dấu thanh: ả, ã, ạ, ế, ộ, ử.",
    "Türkçe'de ı, İ, ş, ğ harfleri vardır. İstanbul'a gidiyorum.",
    "ქართული ენა ძალიან ლამაზია.",
    "Հայերենը հնդեվրոպական լեզու է։",
    "አማርኛ የኢትዮጵያ ቋንቋ ነው።",
    "ᐊᐃᖅᑲᐅᑎᑦ ᐃᓄᒃᑎᑐᑦ — ᏣᎳᎩ ᎦᏬᏂᎯᏍᏗ — ᚠᛇᚻ᛫ᛒᛦᚦ",
    "Ελληνικά, Кириллица, Latin, 漢字, かな, 한글 mixed in one line.",
    "Emoji: 😀😃😄😁 👍🏽👍🏿 👨‍👩‍👧‍👦 🏳️‍🌈 🇺🇸🇯🇵🇩🇪 ❤️ ✌︎ 🦙.cpp",
    "Math: ∀x∈ℝ, ∃y: x² + y² = z²; ∫₀¹ f(x)dx ≈ ∑ᵢ wᵢ f(xᵢ); α→β ⇒ γ ≠ δ.",
    "Currency: $100, €20.50, £3, ¥1000, ₹500, ₿0.001, 1,000,000.00",
    "Dates: 2024-06-11T12:34:56Z, 11/06/2024, 3:45pm, v1.2.3-rc.4",
    "Numbers: 0 7 42 123 4567 89012 3.14159 -2.5e-10 0x1F 0b1010 1_000_000",
    "Unicode digits: ٠١٢٣٤٥٦٧٨٩ ۰۱۲۳ ०१२३ ০১২৩ ๐๑๒๓ ①②③ ⅠⅡⅢ ½ ¾ ²³",
    "Quotes: “double” ‘single’ «guillemets» „low“ 「かぎ」 『二重』",
    "Dashes and dots: a–b—c … ‒ ― · • ‣ ※",
    "URL https://example.com/path?query=1&b=2#frag and mail user.name+tag@example.org",
    "Ünïcödé wïth dïäcrïtïcs: naïve café résumé coöperate",
]

CODE = [
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
    "#include <vector>\n\nint main() {\n  std::vector<int> v{1, 2, 3};\n  return v.size();\n}\n",
    '{"name": "dspark", "version": [0, 1, 0], "nested": {"a": null, "b": true}}',
    "<html>\n  <body class=\"main\">\n    <p>Hello &amp; welcome</p>\n  </body>\n</html>",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%a%' ORDER BY id DESC;",
    "$ ls -la | grep '\\.py$' && echo \"done\" > /dev/null 2>&1",
    "fn main() { let x: Vec<u8> = (0..=255).collect(); println!(\"{:?}\", x); }",
    "    indented_with_spaces = True\n\t\tindented_with_tabs = False\r\n",
    "// comment\n/* block\n   comment */\nconst f = (a, b) => a ?? b;",
    "x = [i**2 for i in range(10) if i % 2 == 0]  # squares\n",
    "if (a != b && c <= d || e >= f) { return !g; }",
    "```python\nprint('hello')\n```\n",
    "key: value\nlist:\n  - item1\n  - item2\n",
    "a+=1;b-=2;c*=3;d/=4;e%=5;f<<=6;g>>=7;h&=8;i|=9;j^=10;",
]

SPECIAL_STRINGS = [
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>",
    "</tool_call>", "<tool_response>", "</tool_response>", "<s>", "</s>", "<unk>", "[INST]",
    "[/INST]", "[TOOL_CALLS]", "<|im_start", "|im_end|>", "<|im_end", "<think", "think>",
    "<<|im_end|>>", "<|im_start|><|im_start|>", "<SPECIAL_20>", "<SPECIAL_999>", "<repo_name>",
    "<|fim_prefix|>", "<|vision_start|>",
]

WHITESPACE = [" ", "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2028", "\u2029",
              "\u0085", "\u200b", "\u2009", "\u202f", "\u000b", "\u000c", "\u180e", "\ufeff"]

CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'M",
                "'LL", "'D", "'ſ", "'\u212a", "’s", "'x"]

NORMALIZATION = [
    "e\u0301", "a\u0308", "o\u0302\u0323", "o\u0323\u0302", "\u1100\u1161\u11a8", "\u1112\u1161\u11ab",
    "\u212b", "\u2126", "\ufb01", "\u00c5", "A\u030a", "x\u0301\u0316", "x\u0316\u0301",
    "\u0958", "\u2460", "\uff21\uff22", "\u1e9b\u0323", "\u0344", "\u0f73",
]


def assigned_code_points():
    """Code points assigned in this Python's Unicode version (14.0 for Python 3.11), so that
    every engine involved (Oniguruma, PCRE2, ICU) knows them."""
    points = []
    for cp in range(0x20, 0x30000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        if unicodedata.category(chr(cp)) not in ("Cn", "Cs", "Co"):
            points.append(cp)
    return points


def random_unicode(rng, points, length):
    return "".join(chr(rng.choice(points)) for _ in range(length))


def random_bytes_text(rng, length):
    data = bytes(rng.randrange(256) for _ in range(length))
    return data.decode("utf-8", errors="replace")


def pick_mix(rng, pools, count):
    return "".join(rng.choice(rng.choice(pools)) for _ in range(count))


def make_corpus():
    rng = random.Random(SEED)
    points = assigned_code_points()
    marks = [cp for cp in points if unicodedata.category(chr(cp)).startswith("M")]
    corpus = []
    corpus += ["", " ", "a", "\n", "0", "\t\t", "🦙"]
    corpus += SENTENCES + CODE + SPECIAL_STRINGS + WHITESPACE + CONTRACTIONS + NORMALIZATION

    # Sentences joined and altered.
    for _ in range(300):
        parts = rng.sample(SENTENCES, rng.randint(1, 4))
        sep = rng.choice([" ", "\n", "\n\n", "  ", "\t", "", " \n ", "\r\n"])
        text = sep.join(parts)
        if rng.random() < 0.3:
            text = text.upper() if rng.random() < 0.5 else text.lower()
        if rng.random() < 0.3:
            text = rng.choice(WHITESPACE) * rng.randint(1, 5) + text
        if rng.random() < 0.3:
            text += rng.choice(WHITESPACE) * rng.randint(1, 5)
        corpus.append(text)

    # Code, with whitespace perturbations.
    for _ in range(150):
        text = "\n".join(rng.sample(CODE, rng.randint(1, 3)))
        if rng.random() < 0.5:
            text = text.replace("    ", rng.choice(["  ", "\t", "        ", "   "]))
        corpus.append(text)

    # Special-token strings glued to text and whitespace in every way.
    for _ in range(300):
        pieces = []
        for _ in range(rng.randint(1, 6)):
            kind = rng.random()
            if kind < 0.4:
                pieces.append(rng.choice(SPECIAL_STRINGS))
            elif kind < 0.7:
                pieces.append(rng.choice(SENTENCES)[: rng.randint(0, 30)])
            else:
                pieces.append(rng.choice(WHITESPACE) * rng.randint(1, 3))
        corpus.append("".join(pieces))

    # Chat-template-like renders.
    for _ in range(60):
        turns = []
        for role in rng.sample(["system", "user", "assistant", "tool"], rng.randint(1, 4)):
            body = rng.choice(SENTENCES)
            if role == "assistant" and rng.random() < 0.5:
                body = "<think>\n" + rng.choice(SENTENCES) + "\n</think>\n" + body
            if role == "tool":
                body = "<tool_response>\n" + rng.choice(CODE) + "\n</tool_response>"
            turns.append(f"<|im_start|>{role}\n{body}<|im_end|>\n")
        corpus.append("".join(turns) + "<|im_start|>assistant\n")

    # Whitespace runs and mixtures.
    for _ in range(200):
        corpus.append(pick_mix(rng, [WHITESPACE, ["a", "b", "x", "Z", "1", ".", "'", "é"]],
                               rng.randint(1, 40)))

    # Contractions, digits and punctuation around words.
    for _ in range(150):
        pools = [CONTRACTIONS, ["word", "Word", "WORD", " I", " you", "123", "4", "٣", "²"],
                 [".", ",", "!", "?", "...", "--", "/", "\\", "(", ")", '"']]
        corpus.append(pick_mix(rng, pools, rng.randint(1, 12)))

    # Normalization-sensitive sequences: base letters followed by random combining marks.
    for _ in range(150):
        text = ""
        for _ in range(rng.randint(1, 8)):
            text += rng.choice("aeiouxAEOHnc가")
            text += "".join(chr(rng.choice(marks)) for _ in range(rng.randint(0, 3)))
        if rng.random() < 0.3:
            text += rng.choice(NORMALIZATION)
        corpus.append(text)

    # Random bytes decoded with errors="replace".
    for _ in range(200):
        corpus.append(random_bytes_text(rng, rng.randint(1, 64)))

    # Random assigned code points of every category.
    for _ in range(300):
        corpus.append(random_unicode(rng, points, rng.randint(1, 40)))

    # Random mixtures of everything above.
    pools = [SENTENCES, CODE, SPECIAL_STRINGS, WHITESPACE, CONTRACTIONS, NORMALIZATION]
    for _ in range(200):
        corpus.append(pick_mix(rng, pools, rng.randint(1, 8)))

    # Long strings.
    corpus.append(" ".join(SENTENCES) * 20)
    corpus.append("\n".join(CODE) * 10)
    corpus.append(" " * 5000)
    corpus.append("\n" * 3000 + "x")
    corpus.append("a" * 4000)
    corpus.append("1234567890" * 500)
    corpus.append("中文" * 2000)
    corpus.append("😀" * 1000)
    corpus.append("<|im_end|>" * 500)
    corpus.append(random_unicode(rng, points, 5000))
    corpus.append(random_bytes_text(rng, 8000))
    corpus.append("".join(rng.choice(SENTENCES + CODE + SPECIAL_STRINGS) for _ in range(400)))
    return corpus


def main():
    corpus = make_corpus()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("w", encoding="ascii") as out:
        for text in corpus:
            out.write(json.dumps(text, ensure_ascii=True) + "\n")
    print(f"wrote {len(corpus)} strings to {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
