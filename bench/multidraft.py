"""Several drafts per row against one chain: exact accept lengths, and what the extra width costs.

    PYTHONPATH=. .venv/bin/python bench/multidraft.py --threads 1     # ~20 min on 2 loaded CPU cores
    PYTHONPATH=. .venv/bin/python bench/multidraft.py --losses e2e_tv --temperatures 1 --batches 1 16
    PYTHONPATH=. .venv/bin/python bench/multidraft.py --hybrid --threads 1 --batches 1 16   # ~3 min

Accept lengths (``bebop.mtp.evaluate``, teacher-forced held-out embedded data, K = 3): one chain, and
n = 2 and 4 i.i.d. first drafts verified by multi-round rejection (``bebop.speculative.multidraft``),
per head and temperature. The data is cut into --groups groups of sequences; the gain n - 1 is the
chains-weighted mean over groups with a 95% t-interval over the groups (paired: both use the same
chains).

Speed: engine tokens/s of rs at K = 3 with one chain and with n chains, on the embedded prompts at each
--batches size, --repeats rounds of one call per setting in a random order; medians, and the per-round
ratio to one chain as median [min, max] (the noise).

With ``--hybrid``, only the speed table, on ``bench/hybrid.py``'s random Qwen3.5 hybrid (three Gated
DeltaNet layers to one attention layer, its ``--quick`` sizes) with an MTP head CE-trained on the
model's own samples as that script trains it; every lane copies the row's recurrent states too.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from collections.abc import Callable

import scipy.stats
import torch

from bebop.embedded import embedded_data, ensure_embedded_head, ensure_embedded_model
from bebop.models import load_model
from bebop.mtp.data import Sequences
from bebop.mtp.evaluate import evaluate_mtp
from bebop.mtp.head import MtpHead
from bebop.speculative import SamplingParams, SpecConfig, generate
from bebop.utils.progress import stage
from bench import hybrid
from bench.rollout import make_prompts, run_order
from bench.scale import IdTokenizer

SPECULATE_K = 3
NUM_DRAFTS = (2, 4)


def accept_lengths(model, head, data, temperature: float, groups: int, pad_id: int) -> dict:
    """Accept lengths of one chain and of n drafts, and the paired gains with 95% intervals over groups."""
    rows = list(range(len(data)))
    parts = [evaluate_mtp(model, head, Sequences([data.token_ids[i] for i in rows[g::groups]],
                                                 [data.starts[i] for i in rows[g::groups]]), speculate_k=SPECULATE_K, temperature=temperature,
                          pad_id=pad_id, num_drafts=NUM_DRAFTS) for g in range(groups)]
    weights = torch.tensor([float(p["num_full_chains"]) for p in parts])
    chain = torch.tensor([p["accept_length_rs"] for p in parts])
    out = {"chains": int(weights.sum()), "entropy": sum(p["target_entropy"] * w for p, w in zip(parts, weights.tolist()))
           / float(weights.sum()), "n1": float((chain * weights).sum() / weights.sum())}
    for n in NUM_DRAFTS:
        multi = torch.tensor([p["accept_length_multi"][n] for p in parts])
        gain = multi - chain
        mean = float((gain * weights).sum() / weights.sum())
        spread = float(gain.std())
        out[f"n{n}"] = float((multi * weights).sum() / weights.sum())
        out[f"gain{n}"] = mean
        out[f"ci{n}"] = float(scipy.stats.t.ppf(0.975, groups - 1)) * spread / math.sqrt(groups)
    return out


def _sync(model) -> None:
    device = next(model.parameters()).device
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measured_speeds(model, tok, head, batches: list[int], temperature: float, repeats: int, max_new: int,
                    prompts_for: Callable[[int], list] = make_prompts) -> list[dict]:
    """Engine tokens/s of one chain (n = 1) and n chains, side by side: per batch size, ``repeats`` rounds
    of one call each in a random order (``bench.rollout.run_order``); medians, and the per-round ratio
    n / one chain as median [min, max]."""
    sampling = SamplingParams(temperature=temperature, max_new_tokens=max_new)
    ns = (1,) + NUM_DRAFTS
    rows = []
    for batch in batches:
        prompts = prompts_for(batch)
        tok_s = {n: [] for n in ns}
        accept = {n: [] for n in ns}
        for n in ns:  # warmup
            generate(model, tok, prompts[:1], mtp=head, sampling=sampling, spec=SpecConfig("rs", SPECULATE_K, num_drafts=n))
        for repeat in range(repeats):
            for n in run_order(list(ns), repeat):
                _sync(model)
                start = time.perf_counter()
                out = generate(model, tok, prompts, mtp=head, sampling=sampling,
                               spec=SpecConfig("rs", SPECULATE_K, num_drafts=n), seed=repeat)
                _sync(model)
                tok_s[n].append(sum(out.lengths) / (time.perf_counter() - start))
                accept[n].append(out.stats.accept_length)
        row = {"batch": batch}
        for n in ns:
            row[f"tok_s{n}"] = statistics.median(tok_s[n])
            row[f"accept{n}"] = statistics.mean(accept[n])
            ratios = [a / b for a, b in zip(tok_s[n], tok_s[1])]
            row[f"ratio{n}"] = (statistics.median(ratios), min(ratios), max(ratios))
        rows.append(row)
        print(f"| {batch} | " + " | ".join(f"{row[f'tok_s{n}']:.0f} ({row[f'accept{n}']:.2f})" for n in ns) + " | "
              + " | ".join("{:.2f} [{:.2f}, {:.2f}]".format(*row[f"ratio{n}"]) for n in NUM_DRAFTS) + " |", flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    ap.add_argument("--losses", nargs="+", default=["ce", "tv", "e2e_tv"], help="embedded heads (draft losses)")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.7, 1.0, 1.3], help="sampling T > 0")
    ap.add_argument("--groups", type=int, default=8, help="groups of held-out sequences (the interval's samples)")
    ap.add_argument("--batches", type=int, nargs="*", default=[1, 4, 16], help="batch sizes of the speed table "
                    "(none: no speed table)")
    ap.add_argument("--speed-temperature", type=float, default=1.0, help="sampling T of the speed table")
    ap.add_argument("--repeats", type=int, default=5, help="timed rounds per batch size")
    ap.add_argument("--max-new-tokens", type=int, default=48, help="completion tokens per row in the speed table")
    ap.add_argument("--threads", type=int, default=0, help="torch threads; 0 = torch's default")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    ap.add_argument("--hybrid", action="store_true", help="only the speed table, on a random Qwen3.5 hybrid "
                    "(bench/hybrid.py --quick's model and head)")
    args = ap.parse_args(argv)
    if args.groups < 2:
        ap.error("--groups must be >= 2 (the interval needs two groups)")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.hybrid:
        return hybrid_speeds(args)
    model, tok = load_model(str(ensure_embedded_model()), device=args.device)
    data = embedded_data("eval", model, tok)
    print(f"# bench/multidraft.py | embedded model | K={SPECULATE_K} | {len(data)} held-out sequences in "
          f"{args.groups} groups | exact accept lengths, gains paired over groups\n", flush=True)
    print("| head | T | H(p) nats | chains | n=1 | n=2 | n=4 | n=2 − n=1 [95% CI] | n=4 − n=1 [95% CI] |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|", flush=True)
    speed_head = None
    for loss in args.losses:
        head = MtpHead.from_pretrained(ensure_embedded_head(loss, model, tok), model).eval()
        for temperature in args.temperatures:
            with stage(f"bench/multidraft.py: {loss} head at T={temperature:g}"):
                r = accept_lengths(model, head, data, temperature, args.groups, tok.pad_token_id)
            print(f"| {loss} | {temperature:g} | {r['entropy']:.3f} | {r['chains']} | {r['n1']:.4f} | {r['n2']:.4f} | "
                  f"{r['n4']:.4f} | {r['gain2']:+.4f} ± {r['ci2']:.4f} | {r['gain4']:+.4f} ± {r['ci4']:.4f} |",
                  flush=True)
        speed_head = head
    if not args.batches:
        return
    speed_table(model, tok, speed_head, f"{args.losses[-1]} head", args, make_prompts)


def speed_table(model, tok, head, what: str, args, prompts_for: Callable[[int], list]) -> None:
    print(f"\nengine tokens/s (accept length), rs K={SPECULATE_K}, T={args.speed_temperature:g}, {what}, "
          f"{args.max_new_tokens} new tokens, {args.repeats} rounds | load {os.getloadavg()[0]:.1f}\n")
    print("| B | n=1 | n=2 | n=4 | n=2 / n=1 | n=4 / n=1 |")
    print("|---:|---:|---:|---:|---:|---:|", flush=True)
    with stage("bench/multidraft.py: engine tokens/s"):
        measured_speeds(model, tok, head, args.batches, args.speed_temperature, args.repeats, args.max_new_tokens,
                        prompts_for)
    print(f"\nload {os.getloadavg()[0]:.1f} at the end", flush=True)


def hybrid_speeds(args) -> None:
    """The speed table on bench/hybrid.py's --quick hybrid and its briefly trained CE head."""
    sizes = hybrid.parse_args(["--quick", "--device", args.device])
    with stage("bench/multidraft.py: a random Qwen3.5 hybrid and its head"):
        model = hybrid.build_model("hybrid", sizes)
        head = hybrid.train_head(model, sizes)
    print(f"# bench/multidraft.py --hybrid | random Qwen3.5 hybrid (3 Gated DeltaNet : 1 attention), D="
          f"{sizes.hidden_size}, {sizes.layers} layers, V={sizes.vocab} | {torch.get_num_threads()} thread(s) | "
          f"{os.cpu_count()} CPUs")
    if args.batches:
        speed_table(model, IdTokenizer(), head, f"CE head ({sizes.head_steps} steps)", args,
                    lambda batch: hybrid.make_prompts(batch, sizes.vocab))


if __name__ == "__main__":
    main()
