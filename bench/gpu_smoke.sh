#!/usr/bin/env bash
# bash bench/gpu_smoke.sh   (from the repository root, on a machine with an NVIDIA GPU)
#
# Bebop's CUDA checks in one run: the tests that skip without a GPU, then each command that loads a
# model on the embedded model with --device cuda --dtype bfloat16. Exits non-zero at the first
# failure and prints "gpu_smoke: all passed" at the end.
#
#   PYTHON=.venv/bin/python   interpreter with bebop's dependencies and a CUDA build of torch
#   BEBOP_CACHE_DIR=DIR       embedded-model cache (default ~/.cache/bebop); an empty cache is
#                             built first: pretraining, self-generated data and the e2e_tv head
#   GPU_SMOKE_OUT=DIR         where the outputs go (default: a new temporary directory, kept)
#   GPU_SMOKE_DEVICE=cpu      a dry run of the script itself on a CPU (slow; skips the CUDA checks)
#   GPU_SMOKE_SAMPLES=N       check-lossless samples per configuration (default 2000)
set -euo pipefail

PYTHON=${PYTHON:-python}
OUT=${GPU_SMOKE_OUT:-$(mktemp -d -t bebop-gpu-smoke-XXXXXX)}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
BEBOP=("$PYTHON" -m bebop.cli)
DEVICE=${GPU_SMOKE_DEVICE:-cuda}
CUDA=(--device "$DEVICE" --dtype bfloat16)

step() { echo; echo "=== gpu_smoke: $*"; }

if [[ $DEVICE == cuda* ]]; then
    step "CUDA present"
    "$PYTHON" -c "import sys, torch; ok = torch.cuda.is_available()
print(torch.__version__, torch.cuda.get_device_name(0) if ok else 'no CUDA device'); sys.exit(0 if ok else 1)"
    step "tests that need CUDA (none may skip here)"
    # NOTE: the CUDA tests skip exactly when torch.cuda.is_available() is False, checked just above.
    "$PYTHON" -m pytest tests/test_devices.py -q -p no:cacheprovider -rs
fi

step "generate (rs, K=3) in $OUT"
"${BEBOP[@]}" generate "${CUDA[@]}" --num-prompts 64 --mode rs --speculate-k 3 \
    --out "$OUT/generate.jsonl" --stats-json "$OUT/generate-stats.json"

step "check-lossless (chi-square, speculative vs plain vs the model's forward pass)"
"${BEBOP[@]}" check-lossless "${CUDA[@]}" --samples "${GPU_SMOKE_SAMPLES:-2000}"

step "train-mtp (30 steps, float32 master weights)"
"${BEBOP[@]}" train-mtp "${CUDA[@]}" --steps 30 --batch-size 16 --out "$OUT/head"
"$PYTHON" - "$OUT/head/model.safetensors" <<'EOF'
import sys
from safetensors import safe_open
with safe_open(sys.argv[1], "pt") as f:
    dtypes = {str(f.get_tensor(k).dtype) for k in f.keys()}
assert dtypes == {"torch.float32"}, f"a head trained in bf16 should be saved from its float32 masters, got {dtypes}"
print("head saved in float32")
EOF

step "eval-mtp of that head"
"${BEBOP[@]}" eval-mtp "${CUDA[@]}" --mtp "$OUT/head" --json "$OUT/eval.json"

step "rl (rs, 2 steps, then a resume to 3)"
RL=(--mode rs --mtp "$OUT/head" --prompts-per-step 2 --group-size 4 --max-new-tokens 32)
"${BEBOP[@]}" rl "${CUDA[@]}" "${RL[@]}" --steps 2 --out "$OUT/run"
"${BEBOP[@]}" rl --resume "$OUT/run" --steps 3
test "$(wc -l < "$OUT/run/metrics.jsonl")" -eq 3

echo
echo "gpu_smoke: all passed (outputs in $OUT)"
