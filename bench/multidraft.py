"""Several drafts per row against one chain: exact accept lengths, and what the extra width costs.

    PYTHONPATH=. .venv/bin/python bench/multidraft.py --threads 1                  # ~5 min on 2 CPU cores
    PYTHONPATH=. .venv/bin/python bench/multidraft.py --losses e2e_tv --temperatures 1 --batches 1 16

Accept lengths (``bebop.mtp.evaluate``, teacher-forced held-out embedded data, K = 3): one chain, and
n = 2 and 4 i.i.d. first drafts verified by multi-round rejection (``bebop.speculative.multidraft``),
per head and temperature. The data is cut into --groups groups of sequences; the gain n - 1 is the
chains-weighted mean over groups with a 95% t-interval over the groups (paired: both use the same
chains).

Costs (``bench.rollout.measure_costs``, medians of interleaved calls on the embedded model): a chain's
rs step is K draft steps at batch B and a verify forward over K + 1 tokens; n chains cost one depth-1
draft step at B, K - 1 at B·n and a verify forward over n·K + 1 tokens (the cost of one tree pass:
the same tokens, attention over a short tree instead of a causal block). The predicted speed-up is
(accept length / step cost) of n chains over that of one chain: forward costs only, the engine's
per-step overhead excluded, so it bounds what an engine would see from above when the overhead is
the same for both.
"""

from __future__ import annotations

import argparse
import math

import scipy.stats
import torch

from bebop.embedded import embedded_data, ensure_embedded_head, ensure_embedded_model
from bebop.models import load_model
from bebop.mtp.data import Sequences
from bebop.mtp.evaluate import evaluate_mtp
from bebop.mtp.head import MtpHead
from bench.rollout import measure_costs

SPECULATE_K = 3
NUM_DRAFTS = (2, 4)
KV_LEN = 64  # cached positions of the cost calls: the embedded task's prompt + completion length


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


def predicted_speedups(model, head, batches: list[int], lengths: dict) -> list[dict]:
    """Forward-cost speed-up of n chains over one chain at each batch size (module docstring)."""
    rows = []
    for batch in batches:
        ks = [SPECULATE_K] + [n * SPECULATE_K for n in NUM_DRAFTS]
        base = measure_costs(model, head, batch, ks, KV_LEN)
        chain_cost = SPECULATE_K * base[SPECULATE_K]["draft_s"] + base[SPECULATE_K]["verify_s"]
        row = {"batch": batch, "plain_ms": 1e3 * base[SPECULATE_K]["plain_s"], "chain_ms": 1e3 * chain_cost}
        for n in NUM_DRAFTS:
            wide = measure_costs(model, head, batch * n, [SPECULATE_K], KV_LEN)[SPECULATE_K]["draft_s"]
            cost = base[SPECULATE_K]["draft_s"] + (SPECULATE_K - 1) * wide + base[n * SPECULATE_K]["verify_s"]
            row[f"n{n}_ms"] = 1e3 * cost
            row[f"speedup{n}"] = (lengths[f"n{n}"] / cost) / (lengths["n1"] / chain_cost)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--losses", nargs="+", default=["ce", "tv", "e2e_tv"], help="embedded heads (draft losses)")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.7, 1.0, 1.3], help="sampling T > 0")
    ap.add_argument("--groups", type=int, default=8, help="groups of held-out sequences (the interval's samples)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16], help="batch sizes of the cost table")
    ap.add_argument("--threads", type=int, default=0, help="torch threads; 0 = torch's default")
    args = ap.parse_args(argv)
    if args.groups < 2:
        ap.error("--groups must be >= 2 (the interval needs two groups)")
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load_model(str(ensure_embedded_model()), device="cpu")
    data = embedded_data("eval", model, tok)
    print(f"# bench/multidraft.py | embedded model | K={SPECULATE_K} | {len(data)} held-out sequences in "
          f"{args.groups} groups | exact accept lengths, gains paired over groups\n", flush=True)
    print("| head | T | H(p) nats | chains | n=1 | n=2 | n=4 | n=2 − n=1 [95% CI] | n=4 − n=1 [95% CI] |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|", flush=True)
    speed_basis = None
    for loss in args.losses:
        head = MtpHead.from_pretrained(ensure_embedded_head(loss, model, tok), model).eval()
        for temperature in args.temperatures:
            r = accept_lengths(model, head, data, temperature, args.groups, tok.pad_token_id)
            print(f"| {loss} | {temperature:g} | {r['entropy']:.3f} | {r['chains']} | {r['n1']:.4f} | {r['n2']:.4f} | "
                  f"{r['n4']:.4f} | {r['gain2']:+.4f} ± {r['ci2']:.4f} | {r['gain4']:+.4f} ± {r['ci4']:.4f} |",
                  flush=True)
            if loss == args.losses[-1] and speed_basis is None and temperature == max(args.temperatures):
                speed_basis = (loss, temperature, r, head)
    loss, temperature, lengths, head = speed_basis
    print(f"\nforward costs (ms, medians) and predicted speed-up over one chain | {loss} head, T={temperature:g}, "
          f"kv_len {KV_LEN}\n")
    print("| B | plain | chain step | n=2 step | n=4 step | n=2 speed-up | n=4 speed-up |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for row in predicted_speedups(model, head, args.batches, lengths):
        print(f"| {row['batch']} | {row['plain_ms']:.2f} | {row['chain_ms']:.2f} | {row['n2_ms']:.2f} | "
              f"{row['n4_ms']:.2f} | {row['speedup2']:.3f} | {row['speedup4']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
