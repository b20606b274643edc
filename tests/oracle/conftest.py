"""Shared fixtures for the oracle tests: where the build, the sources and the fixtures are."""
import os
import pathlib

import pytest

SOURCE_DIR = pathlib.Path(os.environ.get("DSPARK_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
BUILD_DIR = pathlib.Path(os.environ.get("DSPARK_BUILD_DIR", SOURCE_DIR / "build"))
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

