"""Bad sampling and thread flags are refused with a clear message before any model loads."""
import subprocess

import pytest

from conftest import BUILD_DIR


def run_generate(*flags):
    binary = BUILD_DIR / "dspark"
    if not binary.exists():
        pytest.fail(f"{binary} is not built")
    return subprocess.run([str(binary), "generate", "--model", "/nonexistent-model", "--prompt", "hi", *flags],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("flags, message", [
    (["--temp", "nan"], "--temp: nan is not a finite number in [0, 100]"),
    (["--temp", "inf"], "--temp: inf is not a finite number in [0, 100]"),
    (["--temp", "-1"], "--temp: -1 is not a finite number in [0, 100]"),
    (["--top-p", "nan"], "--top-p: nan is not a finite number in [0, 1]"),
    (["--min-p", "NaN"], "--min-p: NaN is not a finite number in [0, 1]"),
    (["--repetition-penalty", "nan"], "--repetition-penalty: nan is not a finite number in [0.01, 100]"),
    (["--presence-penalty", "inf"], "--presence-penalty: inf is not a finite number in [-2, 2]"),
    (["--frequency-penalty", "-nan"], "--frequency-penalty: -nan is not a finite number in [-2, 2]"),
    (["--confidence-threshold", "nan"], "--confidence-threshold: nan is not a finite number in [0, 1]"),
    (["--top-k", "-3"], "--top-k"),
])
def test_bad_sampling_flags_are_refused(flags, message):
    result = run_generate(*flags)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
    assert "terminate" not in result.stderr and "Aborted" not in result.stderr


@pytest.mark.parametrize("command", ["generate", "benchmark"])
@pytest.mark.parametrize("bits", ["-1", "7", "16", "four", "4.5"])
def test_drafter_widths_outside_the_quantizer_are_refused(command, bits):
    result = subprocess.run([str(BUILD_DIR / "dspark"), command, "--model", "/nonexistent-model",
                             "--drafter-bits", bits], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert f"--drafter-bits: {bits} is not 0 (as stored) or a quantization width (2-6 or 8 bits)" \
        in result.stderr, result.stderr


def test_lookup_drafts_on_and_off_together_are_refused():
    result = run_generate("--lookup-drafts", "--no-lookup-drafts")
    assert result.returncode != 0
    assert "--lookup-drafts excludes --no-lookup-drafts" in result.stderr, result.stderr


def test_absurd_thread_counts_are_refused():
    result = run_generate("--threads", "100000")
    assert result.returncode != 0
    assert "--threads: 100000 threads is outside [0, " in result.stderr, result.stderr
    assert "x the" in result.stderr and "CPUs this process may use; 0 = all)" in result.stderr
    assert "system_error" not in result.stderr and "terminate" not in result.stderr


@pytest.mark.parametrize("flags", [["--prefix-cache-slots", "1000000000"],
                                   ["--prefix-cache-slots", "-1"], ["--parallel", "0"]])
def test_absurd_serve_sizes_are_refused_before_the_model_loads(flags):
    """The state pool holds --parallel + --prefix-cache-slots sequences: sizes past their ranges
    are refused by name, not met with an allocation that fails."""
    result = subprocess.run([str(BUILD_DIR / "dspark"), "serve", "--model", "/nonexistent-model",
                             *flags], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert flags[0] in result.stderr and "not in range" in result.stderr, result.stderr
    assert "terminate" not in result.stderr and "bad_alloc" not in result.stderr
