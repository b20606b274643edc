"""Our MLX affine quantization against mlx.core itself.

For every bits x group size, on random weights from fp32, bf16 and f16 sources:
  * quantize: packed words, scales and biases equal mx.quantize bit for bit;
  * dequantize_rows (fp32 s*q + b) equals mx.dequantize on fp32-cast scales and biases bit for
    bit; dequantize_rows_mlx equals mx.dequantize on the 16-bit tensors bit for bit (MLX rounds
    s*q and then the sum to the model dtype);
  * qmatmul / gather_qmatmul (fp32 activations), every ISA this CPU runs: relative L2 error
    ||y - y_mlx|| / ||y_mlx|| <= 1e-5 against mx.quantized_matmul / mx.gather_qmm.
Data travels through .npy files; bf16 arrays as their raw uint16 bit patterns.
"""

import os
import subprocess
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

BUILD_DIR = Path(os.environ.get("DSPARK_BUILD_DIR", "build"))
TOOL = BUILD_DIR / "tests" / "dspark_tool_quant"
BITS = [2, 3, 4, 5, 6, 8]
GROUPS = [32, 64, 128]
RELATIVE_L2_BOUND = 1e-5


def cpu_isas():
    flags = Path("/proc/cpuinfo").read_text().split("flags")[1].split("\n")[0].split()
    isas = ["scalar"]
    if {"avx2", "fma", "f16c"} <= set(flags):
        isas.append("avx2")
        if "avx_vnni" in flags:
            isas.append("avxvnni")
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq", "fma", "f16c"} <= set(flags):
        isas.append("avx512")
        if "avx512_vnni" in flags:
            isas.append("avx512vnni")
    return isas


ISAS = cpu_isas()


def run_tool(command, directory, bits, group, scale_dtype, **extra):
    args = [str(TOOL), command, f"dir={directory}", f"bits={bits}", f"group={group}",
            f"scale_dtype={scale_dtype}"] + [f"{k}={v}" for k, v in extra.items()]
    result = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def bits_of(array):
    """Raw bit patterns of an mx array (uint16 for bf16/f16, uint32 for fp32 and uint32)."""
    if array.dtype in (mx.bfloat16, mx.float16):
        return np.array(array.view(mx.uint16))
    if array.dtype == mx.float32:
        return np.array(array).view(np.uint32)
    return np.array(array)


def save_mlx_matrix(directory, wq, scales, biases):
    np.save(directory / "packed.npy", np.array(wq))
    for name, array in (("scales", scales), ("biases", biases)):
        if array.dtype == mx.float32:
            np.save(directory / f"{name}.npy", np.array(array))
        else:
            np.save(directory / f"{name}.npy", np.array(array.view(mx.uint16)))


def random_weights(rng, rows, cols):
    w = rng.standard_normal((rows, cols)).astype(np.float32) * 0.05
    # Edge cases for the quantizer: a constant-zero group, a constant non-zero group, a group
    # whose negative extreme dominates and one whose positive extreme dominates.
    w[0, :32] = 0.0
    w[1, :32] = 0.75
    w[2, :32] = np.linspace(-3.0, 0.5, 32)
    w[3, :32] = np.linspace(-0.5, 3.0, 32)
    return w


def relative_l2(ours, theirs):
    return float(np.linalg.norm(ours - theirs) / np.linalg.norm(theirs))


@pytest.fixture(scope="module", autouse=True)
def check_tool():
    assert TOOL.exists(), f"{TOOL} not built"


SOURCES = {"float32": (mx.float32, "F32"), "bfloat16": (mx.bfloat16, "BF16"),
           "float16": (mx.float16, "F16")}


@pytest.mark.parametrize("source", list(SOURCES))
@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("bits", BITS)
def test_quantize_dequantize_qmatmul(tmp_path, bits, group, source):
    rng = np.random.default_rng(bits * 1000 + group * 10 + list(SOURCES).index(source))
    rows, cols, m = 24, 4 * group, 3
    mlx_dtype, scale_dtype = SOURCES[source]
    weights = mx.array(random_weights(rng, rows, cols)).astype(mlx_dtype)
    wq, scales, biases = mx.quantize(weights, group_size=group, bits=bits)

    # quantize: bit for bit
    np.save(tmp_path / "weights.npy", np.array(weights.astype(mx.float32)))
    run_tool("quantize", tmp_path, bits, group, scale_dtype)
    np.testing.assert_array_equal(np.load(tmp_path / "packed.npy"), np.array(wq))
    np.testing.assert_array_equal(np.load(tmp_path / "scales.npy").view(bits_of(scales).dtype),
                                  bits_of(scales))
    np.testing.assert_array_equal(np.load(tmp_path / "biases.npy").view(bits_of(biases).dtype),
                                  bits_of(biases))

    # dequantize MLX's own tensors
    save_mlx_matrix(tmp_path, wq, scales, biases)
    run_tool("dequantize", tmp_path, bits, group, scale_dtype)
    in_fp32 = mx.dequantize(wq, scales.astype(mx.float32), biases.astype(mx.float32),
                            group_size=group, bits=bits)
    np.testing.assert_array_equal(np.load(tmp_path / "dequantized.npy"), np.array(in_fp32))
    in_model_dtype = mx.dequantize(wq, scales, biases, group_size=group, bits=bits)
    ours_mlx = mx.array(np.load(tmp_path / "dequantized_mlx.npy")).astype(mlx_dtype)
    np.testing.assert_array_equal(bits_of(ours_mlx), bits_of(in_model_dtype))

    # qmatmul, fp32 activations
    x = rng.standard_normal((m, cols)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    expected = np.array(mx.quantized_matmul(mx.array(x), wq, scales, biases, transpose=True,
                                            group_size=group, bits=bits))
    for isa in ISAS:
        run_tool("qmatmul", tmp_path, bits, group, scale_dtype, isa=isa)
        y = np.load(tmp_path / "y.npy")
        error = relative_l2(y, expected)
        assert error <= RELATIVE_L2_BOUND, f"{isa}: relative L2 error {error:.3g}"


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("bits", BITS)
def test_gather_qmatmul(tmp_path, bits, group):
    rng = np.random.default_rng(bits * 7 + group)
    experts, rows, cols = 5, 16, 2 * group
    weights = mx.array(rng.standard_normal((experts, rows, cols)).astype(np.float32) * 0.05)
    weights = weights.astype(mx.bfloat16)
    wq, scales, biases = mx.quantize(weights, group_size=group, bits=bits)
    save_mlx_matrix(tmp_path, wq, scales, biases)
    ids = np.array([4, 0, 4, 2, 1, 4, 0], dtype=np.int32)
    x = rng.standard_normal((len(ids), cols)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "ids.npy", ids)
    expected = mx.gather_qmm(mx.array(x)[:, None, :], wq, scales, biases,
                             rhs_indices=mx.array(ids.astype(np.uint32)), transpose=True,
                             group_size=group, bits=bits)
    expected = np.array(expected.astype(mx.float32)).reshape(len(ids), rows)
    for isa in ISAS:
        run_tool("gather_qmatmul", tmp_path, bits, group, "BF16", isa=isa)
        error = relative_l2(np.load(tmp_path / "y.npy"), expected)
        assert error <= RELATIVE_L2_BOUND, f"{isa}: relative L2 error {error:.3g}"


@pytest.mark.parametrize("bits", [4, 6, 8])
def test_nemotron_width_qmatmul(tmp_path, bits):
    """A real Nemotron input width (2688) with many rows, bf16 scales, m = 1 and m = 5."""
    rng = np.random.default_rng(bits)
    rows, cols = 200, 2688
    weights = mx.array(rng.standard_normal((rows, cols)).astype(np.float32) * 0.02)
    wq, scales, biases = mx.quantize(weights.astype(mx.bfloat16), group_size=64, bits=bits)
    save_mlx_matrix(tmp_path, wq, scales, biases)
    for m in (1, 5):
        x = rng.standard_normal((m, cols)).astype(np.float32)
        np.save(tmp_path / "x.npy", x)
        expected = np.array(mx.quantized_matmul(mx.array(x), wq, scales, biases, transpose=True,
                                                group_size=64, bits=bits))
        for isa in ISAS:
            run_tool("qmatmul", tmp_path, bits, 64, "BF16", isa=isa)
            error = relative_l2(np.load(tmp_path / "y.npy"), expected)
            assert error <= RELATIVE_L2_BOUND, f"{isa} m={m}: relative L2 error {error:.3g}"
