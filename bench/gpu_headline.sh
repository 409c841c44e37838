#!/usr/bin/env bash
# bash bench/gpu_headline.sh   (from the repository root, on one NVIDIA GPU; at most 10 minutes on an H100)
#
# The paper's headline measured on a GPU, in one run, on the embedded model and its e2e_tv head (built in the
# cache first when missing) or on GPU_HEADLINE_MODEL + GPU_HEADLINE_MTP:
#   1. rollout tokens/s of rs (K=3) against plain decoding at B = 1, 16, 64, 256, T = 1 (bench/rollout.py), and
#      an rs step phase by phase beside a plain step at each B (its --step-profile)
#   2. an RL step with MTP (rs, the frozen head) and without (mode none): mean step and rollout seconds
#   3. Bebop's engine against vLLM on the exported head (bebop export-mtp), plain and MTP, B = 64; skipped with
#      one line when vLLM is not installed
# Each section runs under `timeout` (its process group is sent TERM at its cap, KILL 10 s later); the caps add
# up to 510 s, so with the grace periods (4 x 10 s) and the start's device check (< 10 s) the script ends within
# 560 s < 10 minutes whatever happens. A capped section prints "timed out" and the script goes on; a section
# that fails is reported and the script exits 1 at the end. Nothing in CI runs it.
#
#   PYTHON=.venv/bin/python      interpreter with bebop's dependencies and a CUDA build of torch (and vLLM for 3)
#   GPU_HEADLINE_OUT=DIR         where the outputs go (default: a new temporary directory, kept)
#   GPU_HEADLINE_DEVICE=cpu      a dry run of the whole script on a CPU at tiny sizes (B = 1, 4; 8 tokens)
#   GPU_HEADLINE_MODEL=DIR       an HF model directory instead of the embedded model (with GPU_HEADLINE_MTP=DIR)
set -uo pipefail

PYTHON=${PYTHON:-python}
OUT=${GPU_HEADLINE_OUT:-$(mktemp -d -t bebop-gpu-headline-XXXXXX)}
export GPU_HEADLINE_OUT=$OUT  # NOTE: the sections below that are functions run as `bash $0 --section NAME`
DEVICE=${GPU_HEADLINE_DEVICE:-cuda}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
BEBOP=("$PYTHON" -m bebop.cli)
MODEL_ARGS=()
if [[ -n ${GPU_HEADLINE_MODEL:-} ]]; then
    MODEL_ARGS=(--model "$GPU_HEADLINE_MODEL" --mtp "${GPU_HEADLINE_MTP:?GPU_HEADLINE_MODEL needs GPU_HEADLINE_MTP}")
fi
# Caps in seconds (their sum, 510 s, bounds the run): the cache is tiny-model pretraining (1,200 steps) and head
# training, about a minute on a GPU; the rollout grid is 2 modes x 4 batch sizes x 4 calls of <= 48 decode steps;
# the RL runs are 2 x 5 steps of 64 rollouts; vLLM starts twice (eager mode) and times 4 calls per engine.
CACHE_S=160 ROLLOUT_S=110 RL_S=110 VLLM_S=130
if [[ $DEVICE == cpu ]]; then  # the dry run: the same commands at tiny sizes
    BATCHES=(1 4) NEW=8 REPEATS=1 RL_STEPS=2 RL_SIZE=(--prompts-per-step 2 --group-size 2) VLLM_ROWS=4
    DTYPE=float32
    CACHE_S=600 ROLLOUT_S=300 RL_S=300 VLLM_S=300  # a CPU's eval-mtp alone can pass 160 s on a loaded machine
else
    BATCHES=(1 16 64 256) NEW=48 REPEATS=3 RL_STEPS=5 RL_SIZE=(--prompts-per-step 8 --group-size 8) VLLM_ROWS=64
    DTYPE=bfloat16
fi
FAILED=()

section() {  # section NAME CAP_S COMMAND...: runs the command (or a function of this script) under its cap
    local name=$1 cap=$2
    shift 2
    echo
    echo "=== gpu_headline: $name (at most $cap s)"
    if declare -F "$1" >/dev/null; then  # timeout runs programs, not functions: this script runs the function
        timeout -k 10 "$cap" bash "$0" --section "$1"
    else
        timeout -k 10 "$cap" "$@"
    fi
    local status=$?
    if [[ $status -eq 124 ]]; then
        echo "gpu_headline: $name timed out after $cap s"
        FAILED+=("$name (timed out)")
    elif [[ $status -ne 0 ]]; then
        echo "gpu_headline: $name failed (exit $status)"
        FAILED+=("$name")
    fi
}

rl_runs() {  # the same RL run without MTP and with it (rs, frozen head), then the step times side by side
    local mode
    for mode in none rs; do
        "${BEBOP[@]}" rl "${MODEL_ARGS[@]}" --device "$DEVICE" --dtype "$DTYPE" --mode "$mode" --steps "$RL_STEPS" \
            "${RL_SIZE[@]}" --max-new-tokens "$NEW" --save-every 0 --out "$OUT/rl-$mode" || return
    done
    "$PYTHON" - "$OUT" <<'EOF'
import json, sys
from pathlib import Path

def means(mode):
    rows = [json.loads(x) for x in (Path(sys.argv[1]) / f"rl-{mode}" / "metrics.jsonl").read_text().splitlines()]
    kept = rows[1:] or rows  # the first step warms up (kernels, allocator)
    return {k: sum(r[k] for r in kept) / len(kept) for k in ("step_s", "rollout_s", "train_s", "tokens_per_s")}

none, rs = means("none"), means("rs")
print("| RL step | step s | rollout s | update s | rollout tok/s |\n|---|---|---|---|---|")
for name, m in (("no MTP (none)", none), ("MTP (rs, K=3)", rs)):
    print(f"| {name} | {m['step_s']:.2f} | {m['rollout_s']:.2f} | {m['train_s']:.2f} | {m['tokens_per_s']:.0f} |")
print(f"step speed-up with MTP: {none['step_s'] / rs['step_s']:.2f}x; rollout: {none['rollout_s'] / rs['rollout_s']:.2f}x "
      "(means over the steps after the first, which warms up)")
EOF
}

vllm_compare() {  # Bebop's engine and vLLM (plain, MTP with probabilistic drafts) on the exported head
    "${BEBOP[@]}" export-mtp "${MODEL_ARGS[@]}" --out "$OUT/served" --overwrite || return
    echo "| engine | B | tok/s (median of 3) |"
    echo "|---|---|---|"
    local engine
    for engine in bebop vllm-plain vllm-mtp; do
        "$PYTHON" - "$OUT/served" "$engine" "$VLLM_ROWS" "$NEW" "$DEVICE" <<'EOF' || return
import sys, time
served, engine, rows, new, device = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
from transformers import AutoTokenizer
from bebop.task import arith

tok = AutoTokenizer.from_pretrained(served)
prompts = [tok.encode(p.prompt) for p in arith.make_problems(rows, seed=7)]

def timed(call):
    call()  # warm-up
    best = []
    for _ in range(3):
        start = time.perf_counter()
        tokens = call()
        best.append(tokens / (time.perf_counter() - start))
    return sorted(best)[1]  # the median of 3

if engine == "bebop":
    from bebop.models import load_model
    from bebop.mtp.native import import_mtp
    from bebop.speculative import SamplingParams, SpecConfig, generate
    model, tokenizer = load_model(served, device=device)
    head = import_mtp(served, model)  # the head vLLM serves, read back from the exported checkpoint
    sampling = SamplingParams(temperature=1.0, max_new_tokens=new)
    for mode in ("none", "rs"):
        spec = SpecConfig(mode, 3)
        rate = timed(lambda: sum(generate(model, tokenizer, prompts, mtp=head, sampling=sampling, spec=spec).lengths))
        print(f"| Bebop {mode} | {rows} | {rate:.0f} |")
else:
    import vllm
    # rejection sampling of the drafts ("probabilistic"), as Bebop's rs; a vLLM without that key drafts greedily
    spec = {"method": "mtp", "num_speculative_tokens": 3, "draft_sample_method": "probabilistic"}
    def start(speculative_config):
        return vllm.LLM(model=served, dtype="auto", enforce_eager=True, gpu_memory_utilization=0.3, seed=0,
                        speculative_config=speculative_config)
    if engine == "vllm-plain":
        spec, llm = None, start(None)
    else:
        try:
            llm = start(spec)
        except Exception as error:  # noqa: BLE001 - any refusal of the key: this vLLM version lacks it
            print(f"gpu_headline: vLLM refused draft_sample_method ({type(error).__name__}); greedy drafts instead")
            spec = {"method": "mtp", "num_speculative_tokens": 3}
            llm = start(spec)
    params = vllm.SamplingParams(temperature=1.0, max_tokens=new, ignore_eos=False)
    def call():
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outs)
    name = "plain" if spec is None else f"MTP K=3, {spec.get('draft_sample_method', 'greedy')} drafts"
    print(f"| vLLM {name} (eager) | {rows} | {timed(call):.0f} |")
EOF
    done
}

if [[ ${1:-} == --section ]]; then  # `section` runs a function of this script through here, under its timeout
    "$2"
    exit
fi

echo "gpu_headline: outputs in $OUT; device $DEVICE"
"$PYTHON" -c "import torch; print('torch', torch.__version__, '|', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA device')"
if [[ $DEVICE == cuda* ]] && ! "$PYTHON" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_headline: no CUDA device; run a dry run with GPU_HEADLINE_DEVICE=cpu"
    exit 1
fi

# The acceptance the speed-ups rest on (and, on an empty cache, the embedded model and head are built here).
section "model, head and their acceptance (eval-mtp, K=3, T=1)" "$CACHE_S" \
    "${BEBOP[@]}" eval-mtp "${MODEL_ARGS[@]}" --device "$DEVICE" --dtype "$DTYPE" --speculate-k 3 \
    --json "$OUT/eval.json"

section "rollout tokens/s, rs (K=3) vs plain, B = ${BATCHES[*]}" "$ROLLOUT_S" \
    "$PYTHON" bench/rollout.py "${MODEL_ARGS[@]}" --device "$DEVICE" --batch-sizes "${BATCHES[@]}" --ks 3 \
    --temperatures 1 --modes rs --no-hf --max-new-tokens "$NEW" --repeats "$REPEATS" --json "$OUT/rollout.json" \
    --step-profile 3

section "RL step with and without MTP ($RL_STEPS steps each)" "$RL_S" rl_runs

echo
if "$PYTHON" -c "import vllm" >/dev/null 2>&1; then
    section "Bebop's engine vs vLLM on the exported head (B = $VLLM_ROWS, T = 1)" "$VLLM_S" vllm_compare
else
    echo "=== gpu_headline: vLLM is not installed for $PYTHON; skipping Bebop's engine vs vLLM"
fi

echo
if [[ ${#FAILED[@]} -gt 0 ]]; then
    printf 'gpu_headline: failed: %s\n' "${FAILED[@]}"
    exit 1
fi
echo "gpu_headline: all sections ran (outputs in $OUT)"
