"""A model larger than this machine's memory is refused before its first forward unless --force.

The large model is the default model plus a sparse shard of padding larger than MemTotal (a tied
model ignores lm_head.* tensors, so only the memory estimate sees it): no disk space is used and no
weight of it is ever read.
"""
import json
import os
import struct
import subprocess

import pytest

from conftest import BUILD_DIR, SOURCE_DIR


def mem_total_bytes():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    pytest.skip("no MemTotal in /proc/meminfo")


def safetensors_names(path):
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return [name for name in json.loads(f.read(length)) if name != "__metadata__"]


@pytest.fixture(scope="module")
def oversized(smollm2, tmp_path_factory):
    out = tmp_path_factory.mktemp("oversized")
    for name in os.listdir(smollm2):
        if name != "model.safetensors":
            os.symlink(smollm2 / name, out / name)
    os.symlink(smollm2 / "model.safetensors", out / "model-00001-of-00002.safetensors")
    padding = mem_total_bytes() + (8 << 30)
    header = json.dumps({"lm_head.padding": {"dtype": "U8", "shape": [padding],
                                              "data_offsets": [0, padding]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(out / "model-00002-of-00002.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + padding)
    weight_map = {name: "model-00001-of-00002.safetensors"
                  for name in safetensors_names(smollm2 / "model.safetensors")}
    weight_map["lm_head.padding"] = "model-00002-of-00002.safetensors"
    (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return out


def run(*args):
    return subprocess.run([str(BUILD_DIR / "dspark"), *args], capture_output=True, text=True,
                          timeout=120)


def test_generate_refuses_a_model_larger_than_memory(oversized):
    result = run("generate", "--model", str(oversized), "--prompt", "hi", "--max-tokens", "2")
    assert result.returncode != 0
    assert "does not fit in memory: needs" in result.stderr, result.stderr
    assert "GB of weights" in result.stderr and "available of" in result.stderr
    assert "reread from disk through the page cache" in result.stderr
    assert "Pass --force to run it anyway" in result.stderr
    assert result.stdout == ""


def test_force_runs_it_with_a_warning(oversized):
    result = run("generate", "--model", str(oversized), "--prompt", "hi", "--max-tokens", "2",
                 "--mode", "baseline", "--ignore-eos", "--force")
    assert result.returncode == 0, result.stderr
    assert "warning:" in result.stderr and "running anyway (--force)" in result.stderr
    assert "Generation: 2 tokens" in result.stderr, result.stderr


def test_doctor_reports_the_estimate(oversized, smollm2):
    result = run("doctor", "--model", str(oversized), "--context", "1024")
    assert result.returncode == 0, result.stderr
    line = next(l for l in result.stdout.splitlines() if l.startswith(f"model {oversized}"))
    assert "does NOT fit: would stream weights from disk (--force)" in line
    assert "at 1024 tokens" in line
    fits = run("doctor", "--model", str(smollm2))
    assert f"model {smollm2}: fits in memory: needs" in fits.stdout, fits.stdout


def test_doctor_names_a_drafter_beside_its_target(smollm2, tmp_path):
    """The README's install puts the DSpark head beside the default model; doctor lists it as a
    drafter, not as a model that cannot be opened (it has no embedding of its own)."""
    os.symlink(smollm2, tmp_path / "SmolLM2-135M-Instruct")
    os.symlink(SOURCE_DIR / "data/dspark_head/SmolLM2-135M-Instruct-DSpark",
               tmp_path / "SmolLM2-135M-Instruct-DSpark")
    result = run("doctor", "--models-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    lines = {l.split()[0]: l for l in result.stdout.splitlines() if l.startswith("  ")}
    assert "fits in memory: needs" in lines["SmolLM2-135M-Instruct"], result.stdout
    head = lines["SmolLM2-135M-Instruct-DSpark"]
    assert "a DeepSpec drafter: runs beside its target" in head, result.stdout
    assert "cannot be opened" not in result.stdout
