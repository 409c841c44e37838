"""Where a decode step's time goes: an rs step phase by phase beside a plain step, at each batch size.

``bench/rollout.py --step-profile K`` prints the table (``profile_table``) for the embedded model or
any model and head; ``bench/hybrid.py`` prints it for its hybrid and full-attention models. Run as a
script, it prints it at a real vocabulary: bench/scale.py's random model (V = 151,936, 2 layers of
D = 1,024) with a head warm-started from its last layer (random weights: its accept length says nothing
of a trained head's; the phases' costs are what the table is for)::

    PYTHONPATH=. .venv/bin/python bench/step_profile.py --batch-sizes 16 --max-new-tokens 8

Phases (each step's wall time is split among them; mean milliseconds per decode step):
    draft           ``Drafter.draft``: the K chained head steps, their lm_head and the drafts' sampling
    forward         ``Target.forward``: the verify forward over K+1 tokens (rs), the forward over 1 (plain)
    sample+verify   the target's distribution p, the verify noise and the verifier (rs); the token's
                    sampling with its entropy (plain)
    commit          the target cache's commit (rollback) and the head's pending inputs
    bookkeeping     the rest of the step: statistics, the host sync, emitting tokens, finished rows

Every phase is also printed as a multiple of a plain step (``none``'s mean step at the same B); the
rs step's total over a plain step is what the speed-up pays per verify step. On a GPU every timed
phase is bracketed by a synchronisation (a profile, not a timing of the engine as it runs).
Calls alternate between none and rs within each repeat; the spread is the min and max of the rs/plain
step ratio over repeats.
"""

from __future__ import annotations

import contextlib
import statistics
import time

import torch

from bebop.speculative import SamplingParams, SpecConfig, engine
from bebop.speculative.drafter import Drafter
from bebop.speculative.target import Target, TargetCache

PHASES = ("draft", "forward", "sample+verify", "commit", "bookkeeping")
TIMED = {  # (owner, attribute) -> phase; an inner call of a timed call counts in the outer one's phase
    (Drafter, "draft"): "draft",
    (Target, "forward"): "forward",
    (engine._Runner, "_sample"): "sample+verify",
    (engine._Runner, "_probs"): "sample+verify",
    (engine, "verify_keyed"): "sample+verify",
    (engine, "greedy_verify"): "sample+verify",
    (TargetCache, "commit"): "commit",
    (TargetCache, "shift_all"): "commit",
    (Drafter, "accept"): "commit",
    (Drafter, "push"): "commit",
}


@contextlib.contextmanager
def phase_clock(device: torch.device):
    """Wraps the ``TIMED`` functions; yields a dict phase -> seconds that they fill while the block runs."""
    seconds = dict.fromkeys(PHASES, 0.0)
    active = [False]

    def timed(fn, phase):
        def wrapper(*args, **kwargs):
            if active[0]:
                return fn(*args, **kwargs)
            active[0] = True
            _sync(device)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                _sync(device)
                seconds[phase] += time.perf_counter() - start
                active[0] = False
        return wrapper

    originals = {(owner, name): getattr(owner, name) for owner, name in TIMED}
    try:
        for (owner, name), phase in TIMED.items():
            setattr(owner, name, timed(originals[(owner, name)], phase))
        yield seconds
    finally:
        for (owner, name), fn in originals.items():
            setattr(owner, name, fn)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_call(model, tok, head, prompts, mode: str, k: int, temperature: float, max_new: int,
                 seed: int = 0) -> tuple[dict[str, float], int, float]:
    """One ``Decoder`` call's decode steps -> (seconds per phase, decode steps, accept length or NaN)."""
    device = next(model.parameters()).device
    sampling = SamplingParams(temperature=temperature, max_new_tokens=max_new)
    spec = SpecConfig(mode=mode, speculate_k=max(k, 1))
    decoder = engine.Decoder(model, tok, prompts, mtp=head if mode != "none" else None, sampling=sampling,
                             spec=spec, seed=seed)
    with phase_clock(device) as seconds:
        while decoder.num_active:
            decoder.step()
    total = sum(t for _, t, _ in decoder.step_times)
    seconds["bookkeeping"] = total - sum(seconds[p] for p in PHASES if p != "bookkeeping")
    result = decoder.result()
    return dict(seconds), len(decoder.step_times), result.stats.accept_length if k else float("nan")


def profile_table(model, tok, head, prompts_for, batch_sizes: list[int], k: int = 3, temperature: float = 1.0,
                  max_new: int = 32, repeats: int = 3) -> str:
    """The markdown table of ``profile_call`` for none and rs K at each B; ``prompts_for(B)`` gives B prompts."""
    lines = [f"### Step profile: rs K={k} vs plain, T={temperature:g}, ms per decode step (x a plain step)", "",
             "| B | step | " + " | ".join(PHASES) + " | total | rs/plain [min, max] | accept len |",
             "|---:|:---|" + "---:|" * (len(PHASES) + 3)]
    for batch in batch_sizes:
        prompts = prompts_for(batch)
        for mode in ("none", "rs"):  # warmup
            profile_call(model, tok, head, prompts, mode, k if mode == "rs" else 0, temperature, 4)
        per = {"none": [], "rs": []}
        accept = float("nan")
        for r in range(repeats):
            for mode in ("none", "rs") if r % 2 == 0 else ("rs", "none"):
                seconds, steps, acc = profile_call(model, tok, head, prompts, mode, k if mode == "rs" else 0,
                                                   temperature, max_new, seed=r)
                per[mode].append({p: s / steps for p, s in seconds.items()})
                accept = acc if mode == "rs" else accept
        mean = {mode: {p: statistics.mean(x[p] for x in per[mode]) for p in PHASES} for mode in per}
        plain = sum(mean["none"].values())
        ratios = [sum(r.values()) / sum(n.values()) for r, n in zip(per["rs"], per["none"])]
        for mode, name in (("none", "plain"), ("rs", "rs")):
            cells = [f"{mean[mode][p] * 1e3:.2f} ({mean[mode][p] / plain:.2f})" for p in PHASES]
            total = sum(mean[mode].values())
            extra = f"{total / plain:.2f} [{min(ratios):.2f}, {max(ratios):.2f}] | {accept:.2f}" if mode == "rs" \
                else " | "
            lines.append(f"| {batch} | {name} | " + " | ".join(cells) + f" | {total * 1e3:.2f} | {extra} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    import argparse

    from bebop.mtp.head import MtpHead
    from bench.scale import QWEN3_VOCAB, IdTokenizer, _random_ids, build_model

    ap = argparse.ArgumentParser(description="the step profile at a real vocabulary", allow_abbrev=False)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[16], help="rows B")
    ap.add_argument("--max-new-tokens", type=int, default=8, help="tokens per row and call")
    ap.add_argument("--repeats", type=int, default=2, help="calls per mode and B")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = build_model(QWEN3_VOCAB, 2)
    head = MtpHead(model).eval()
    for param in list(model.parameters()) + list(head.parameters()):
        param.requires_grad_(False)
    print(profile_table(model, IdTokenizer(), head, lambda b: _random_ids(b, 32, QWEN3_VOCAB), args.batch_sizes,
                        max_new=args.max_new_tokens, repeats=args.repeats))


if __name__ == "__main__":
    main()
