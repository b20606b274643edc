#!/usr/bin/env python3
"""Prints a Markdown table of `dspark benchmark --json` results, for the README.

    benchmark_table.py RESULT.json [RESULT.json ...]

One row per run (plain decoding, then each mode and cap) of each file; speed-ups are the medians of
per-trial ratios to plain decoding measured side by side, averaged over each suite's prompts and then
over the suites, as the benchmark reports them. A footnote per file quotes the machine and the roofline
measured in the same run.
"""

import json
import sys


def fmt_speedups(run, suites):
    per_suite = " / ".join(f"{run['per_suite'][s]['speedup']:.2f}" for s in suites)
    return f"{run['speedup']:.2f}× ({per_suite})"


def cap_label(run):
    if run["mode"] == "baseline":
        return "–"
    choice = run["cap_choice"]
    lookup = " + lookup" if choice.endswith("+lookup") else ""
    choice = choice.removesuffix("+lookup")
    if choice == "auto":
        return f"auto (from {run['cap']}){lookup}"
    if choice.startswith("derived"):
        return f"{run['cap']} ({choice}){lookup}"
    return f"{run['cap']}{lookup}"


def table(results):
    suites = results[0]["suites"]
    lines = [
        f"| target | run | cap | tok/s e2e | decode tok/s | speed-up ({' / '.join(suites)}) | tokens/round "
        "| slot acceptance 1–4 | peak RSS | same output as plain |",
        "|---|---|---|---:|---:|---|---:|---|---:|---|",
    ]
    notes = []
    for index, result in enumerate(results, start=1):
        if result["suites"] != suites:
            raise SystemExit(f"result {index} has suites {result['suites']}, expected {suites}")
        for run in result["runs"]:
            plain = run["mode"] == "baseline"
            slots = " ".join(f"{a:.2f}" for a in run["slot_acceptance"][:4]) or "–"
            cap = cap_label(run)
            lines.append(
                f"| {result['target']}<sup>{index}</sup> | {run['run']} | {cap} | {run['tok_s']:.1f} "
                f"| {run['decode_tok_s']:.1f} | {'1.00×' if plain else fmt_speedups(run, suites)} "
                f"| {run['accept']:.2f} | {slots} | {run['peak_rss_bytes'] / 1e9:.2f} GB "
                f"| {'–' if plain else ('yes' if run['matches_plain'] else 'NO')} |"
            )
        roof = result["roofline"]
        cal = result["calibration"]
        plain_decode = result["runs"][0]["decode_tok_s"]
        notes.append(
            f"<sup>{index}</sup> {result['device']}, {result['threads']} threads, {result['trials']} trials × "
            f"{result['max_new_tokens']} tokens per prompt, dspark {result['dspark']}. Roofline: "
            f"{roof['bytes_per_token'] / 1e6:.1f} MB per token / {roof['bandwidth_all_gbs']:.1f} GB/s measured "
            f"= {roof['ceiling_tok_s']:.0f} tok/s (plain decode at {100 * plain_decode / roof['ceiling_tok_s']:.0f} %). "
            f"Derived cap {cal['derived_cap']} for the target alone (verify ms by width: "
            + ", ".join(f"{w}: {ms:.3g}" for w, ms in cal["verify"].items())
            + ")"
            + "".join(
                f"; {mode} with its drafter: derived cap {c['derived_cap']} (drafter ms by cap: "
                + ", ".join(f"{n}: {ms:.3g}" for n, ms in c.get("drafter", {}).items())
                + ")"
                for mode, c in result.get("drafter_calibrations", {}).items()
            )
            + "."
            + "".join(f" {s['mode']}: skipped ({s['reason']})." for s in result.get("skipped", []))
        )
    return "\n".join(lines) + "\n\n" + "\n\n".join(notes) + "\n"


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    results = []
    for path in argv[1:]:
        with open(path) as f:
            results.append(json.load(f))
    sys.stdout.write(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
