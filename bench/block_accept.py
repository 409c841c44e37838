"""Block vs token-wise verification along the engine's own chains: exact expected accepts, paired.

    PYTHONPATH=. .venv/bin/python bench/block_accept.py --threads 1     # ~2 min on 2 CPU cores
    PYTHONPATH=. .venv/bin/python bench/block_accept.py --losses e2e_tv --temperatures 1 --rows 256

At every verify step of an rs rollout (the engine's drafts ŷ ~ q, its p and q after the user's
temperature), both verifiers' expected accepted drafts given those drafts are exact:
token-wise Σ_j Π_{i<=j} min(1, r_i), block Σ_j w_j (``bebop.speculative.block``). Their means over
all verify steps, and the paired difference with a 95% interval (normal, over verify steps; steps of
one row are treated as independent), estimate the accept-length gain of block verification on the
chains rollouts actually draft, free of the noise of the accept coins. Rows decode with token-wise
verification (the run's verifier, wrapped to record both expectations before it decides). Accept
length = 1 + expected accepts.
"""

from __future__ import annotations

import argparse
import math

import torch

from bebop.embedded import ensure_embedded_head, ensure_embedded_model
from bebop.models import load_model
from bebop.mtp.head import MtpHead
from bebop.speculative import SamplingParams, SpecConfig
from bebop.speculative.block import prefix_weights
from bebop.speculative.engine import Decoder
from bebop.speculative.sampling import acceptance_probs
from bebop.speculative.verification import Verifier
from bebop.task import arith
from bebop.utils.progress import stage

PROMPT_SEED = 1  # problems drawn for the prompts
Z95 = 1.96  # normal quantile of a 95% interval


def recording(verifier: Verifier, steps: list[tuple[torch.Tensor, torch.Tensor]]) -> Verifier:
    """``verifier``, appending each verify step's (token-wise (R,), block (R,)) expected accepts to ``steps`` first."""

    def record(target_probs, draft_tokens, draft_probs, uniform):
        token = acceptance_probs(target_probs, draft_tokens, draft_probs).cumprod(1).sum(1)
        block = prefix_weights(target_probs, draft_tokens, draft_probs)[:, 1:].sum(1)
        steps.append((token.double(), block.double()))
        return verifier(target_probs, draft_tokens, draft_probs, uniform)

    return record


def measure(model, tok, head, k: int, temperature: float, rows: int, max_new: int) -> dict:
    steps: list[tuple[torch.Tensor, torch.Tensor]] = []
    prompts = [p.prompt for p in arith.make_problems(rows, seed=PROMPT_SEED)]
    decoder = Decoder(model, tok, prompts, mtp=head, sampling=SamplingParams(temperature=temperature,
                      max_new_tokens=max_new), spec=SpecConfig("rs", k, verify="token"), seed=0)
    decoder.runner.verifier = recording(decoder.runner.verifier, steps)  # the verifier this run chose, once
    while decoder.num_active:
        decoder.step()
    token = torch.cat([t for t, _ in steps])
    block = torch.cat([b for _, b in steps])
    diff = block - token
    half = Z95 * float(diff.std()) / math.sqrt(diff.numel())
    return {"verify_steps": diff.numel(), "token": 1 + float(token.mean()), "block": 1 + float(block.mean()),
            "gain": float(diff.mean()), "gain_ci95": half, "min_gain": float(diff.min())}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    ap.add_argument("--losses", nargs="+", default=["ce", "e2e_tv"], help="embedded heads (draft losses)")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.7], help="sampling T > 0")
    ap.add_argument("--speculate-k", type=int, default=3, help="K, drafts per verify step")
    ap.add_argument("--rows", type=int, default=128, help="prompts (rows) per rollout")
    ap.add_argument("--max-new-tokens", type=int, default=48, help="completion tokens per row")
    ap.add_argument("--threads", type=int, default=0, help="torch threads; 0 = torch's default")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load_model(str(ensure_embedded_model()), device="cpu")
    print(f"# bench/block_accept.py | embedded model | K={args.speculate_k} | {args.rows} rows x "
          f"{args.max_new_tokens} tokens | exact expectations per verify step, paired\n")
    print("| head | T | verify steps | accept length token | accept length block | block − token [95% CI] "
          "| block / token |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for loss in args.losses:
        head = MtpHead.from_pretrained(ensure_embedded_head(loss, model, tok), model).eval()
        for temperature in args.temperatures:
            with stage(f"bench/block_accept.py: {loss} head at T={temperature:g}"):
                r = measure(model, tok, head, args.speculate_k, temperature, args.rows, args.max_new_tokens)
            assert r["min_gain"] >= -1e-6, r  # block never expects fewer accepts, step by step
            print(f"| {loss} | {temperature:g} | {r['verify_steps']} | {r['token']:.4f} | {r['block']:.4f} | "
                  f"{r['gain']:+.4f} ± {r['gain_ci95']:.4f} | {r['block'] / r['token']:.4f} |", flush=True)


if __name__ == "__main__":
    main()
