"""Peak memory and time of the draft losses: fused with the lm_head, chunked, plain autograd.

    PYTHONPATH=. .venv/bin/python bench/draft_loss.py                     # N 256/512/1024, D 2048, ~5 min on 2 CPU cores
    PYTHONPATH=. .venv/bin/python bench/draft_loss.py --hidden-size 0     # logits inputs: plain vs chunked
    PYTHONPATH=. .venv/bin/python bench/draft_loss.py --search            # largest N plain survives
    PYTHONPATH=. .venv/bin/python bench/draft_loss.py --n 4096 --methods fused   # beyond plain's reach here: ~4.5 min
    PYTHONPATH=. .venv/bin/python bench/draft_loss.py --n 1024 4096 --device cuda

Methods, all from the same inputs: ``plain`` (logits = hidden @ weight.T, then full (N, K, V)
softmaxes under ordinary autograd), ``chunked`` (the same logits, then bebop.losses.draft_loss) and
``fused`` (bebop.losses.draft_loss_from_hidden: no (N, K, V) tensor at all). Inputs are float32
draft and target hidden states (N, K, D) and a frozen lm_head weight (V, D) (as in train-mtp), or
with ``--hidden-size 0`` (N, K, V) logits (plain and chunked only); a draft near its target, and
chains cut at the sequence end.

Each (N, loss, method) runs forward + backward once (after a tiny warm-up) in a fresh subprocess,
so peaks do not mix. Peak memory is VmHWM from /proc/self/status on CPU (the process's
high-water resident set, inputs included) and torch.cuda.max_memory_allocated on CUDA; "extra"
is the peak minus the memory held once the inputs exist.

--search doubles N from --n-start until the plain version fails or its projected peak at the
next N exceeds --mem-frac of MemAvailable. Each CPU worker runs under RLIMIT_AS of that budget,
so a run that does not fit fails with an allocation error instead of waking the OOM killer
(which could pick another process on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from bebop.losses import draft_loss, draft_loss_from_hidden
from bebop.utils.progress import stage

# NOTE: with logits inputs (--hidden-size 0), --search on the 24 GiB, 2-core development machine
# (other jobs running): plain survived N=512 (9.9 GB peak) and failed at N=1024 (~16.6 GB projected).
DEFAULT_N = [256, 512, 1024]  # hidden inputs at D = 2048: plain fits (N = 1024: 16.4 GB peak), ~5 min in all


def _logits(draft, target, weight):
    """(draft logits with grad, target logits without) from hidden states, or the logits themselves."""
    if weight is None:
        return draft, target
    with torch.no_grad():
        target_logits = F.linear(target, weight)  # (N, K, V)
    return F.linear(draft, weight), target_logits


def plain_loss(name, draft, target, weight, mask, temperature):
    """Naive autograd ce / tv / e2e_tv: full (N, K, V) logits and softmaxes kept for backward."""
    draft_logits, target_logits = _logits(draft, target, weight)
    p = torch.softmax(target_logits.detach().float() / temperature, dim=-1)  # (N, K, V)
    if name == "ce":
        ce = -(p * torch.log_softmax(draft_logits.float() / temperature, dim=-1)).sum(dim=-1)  # (N, K)
        return torch.where(mask, ce, 0.0).sum() / mask.sum().clamp_min(1)
    q = torch.softmax(draft_logits.float() / temperature, dim=-1)  # (N, K, V)
    alpha = torch.minimum(p, q).sum(dim=-1)  # (N, K)
    if name == "tv":
        return torch.where(mask, 1.0 - alpha, 0.0).sum() / mask.sum().clamp_min(1)
    prefix = (~mask).cumsum(dim=1) == 0  # (N, K)
    num_steps = prefix.sum(dim=1)  # (N,)
    chain = torch.where(prefix, torch.where(prefix, alpha, 1.0).cumprod(dim=1), 0.0).sum(dim=1)
    per_chain = 1.0 - chain / num_steps.clamp_min(1)
    valid = num_steps > 0
    return torch.where(valid, per_chain, 0.0).sum() / valid.sum().clamp_min(1)


def chunked_loss(name, draft, target, weight, mask, temperature):
    """bebop.losses.draft_loss with its default tile sizes, on the (N, K, V) logits."""
    return draft_loss(name, *_logits(draft, target, weight), mask, temperature)


def fused_loss(name, draft, target, weight, mask, temperature):
    """bebop.losses.draft_loss_from_hidden with its default tile sizes."""
    return draft_loss_from_hidden(name, draft, target, weight, mask, temperature)


METHODS = {"plain": plain_loss, "chunked": chunked_loss, "fused": fused_loss}


def _status_mb(key: str) -> float:
    """A 'kB' field of /proc/self/status in MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    raise KeyError(key)


def _mem_available_mb() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    raise KeyError("MemAvailable")


def make_inputs(n: int, args: argparse.Namespace):
    """(draft (N, K, X) requiring grad, target (N, K, X), weight (V, D) or None, mask (N, K)).

    X = D (hidden states of a random frozen lm_head) or, with hidden_size 0, X = V (logits).
    """
    if not args.hidden_size:
        return (*_make_logits(n, args), None, _chain_mask(n, args))
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    gen = torch.Generator(device=device).manual_seed(0)
    shape = (n, args.k, args.hidden_size)
    # Logits of standard deviation ~2.5, as in the logits inputs; the draft's hidden state is the
    # target's plus noise, so alpha is neither 0 nor 1.
    weight = torch.randn(args.vocab, args.hidden_size, generator=gen, device=device, dtype=dtype)
    weight /= args.hidden_size**0.5
    target = 2.5 * torch.randn(shape, generator=gen, device=device, dtype=dtype)
    draft = (target + torch.randn(shape, generator=gen, device=device, dtype=dtype)).requires_grad_()
    return draft, target, weight, _chain_mask(n, args)


def _chain_mask(n: int, args: argparse.Namespace) -> torch.Tensor:  # (N, K) bool
    """Chains are cut at the sequence end: position n has min(K, N - n) draft steps."""
    steps = torch.arange(args.k, device=args.device)
    return (torch.arange(n, device=args.device)[:, None] + steps) < n


def _make_logits(n: int, args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor]:
    """Draft logits (N, K, V) requiring grad, target logits (N, K, V)."""
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    gen = torch.Generator(device=device).manual_seed(0)
    shape = (n, args.k, args.vocab)
    # A draft near its target, so alpha is neither 0 nor 1. Uniform logits and one (K, V) noise
    # block shared by all N keep input generation a small part of each run.
    target = torch.empty(shape, device=device, dtype=dtype).uniform_(-5.0, 5.0, generator=gen)
    noise = torch.randn(shape[1:], generator=gen, device=device, dtype=dtype)  # (K, V)
    return (target + noise).requires_grad_(), target


def run_worker(args: argparse.Namespace) -> dict:
    """One forward + backward of one (N, loss, method); returns its measurements."""
    device, loss_fn = torch.device(args.device), METHODS[args.method]
    if device.type == "cpu" and args.mem_limit_mb:
        limit = int((_status_mb("VmSize") + args.mem_limit_mb) * 2**20)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    warm = make_inputs(2, args)  # load kernels, not timed
    loss_fn(args.loss[0], *warm, args.temperature).backward()
    del warm
    draft, target, weight, mask = make_inputs(args.n[0], args)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base_mb = torch.cuda.memory_allocated() / 2**20
    else:
        base_mb = _status_mb("VmRSS")
    start = time.perf_counter()
    loss = loss_fn(args.loss[0], draft, target, weight, mask, args.temperature)
    loss.backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    if device.type == "cuda":
        peak_mb = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak_mb = _status_mb("VmHWM")
    return {"peak_mb": peak_mb, "extra_mb": peak_mb - base_mb, "seconds": seconds,
            "loss": loss.item()}


def measure(args: argparse.Namespace, n: int, loss: str, method: str) -> dict | None:
    """Runs one configuration in a fresh subprocess; None if it failed (e.g. out of memory)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--n", str(n),
           "--loss", loss, "--method", method, "--vocab", str(args.vocab), "--k", str(args.k),
           "--hidden-size", str(args.hidden_size),
           "--device", args.device, "--dtype", args.dtype, "--temperature", str(args.temperature),
           "--mem-limit-mb", str(int(args.mem_frac * _mem_available_mb()))]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"  N={n} {loss} {method} failed (rc {proc.returncode}): "
              f"{proc.stderr.strip().splitlines()[-1:] }", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_n(args: argparse.Namespace, n: int) -> list[dict]:
    """Every method for every loss at one N."""
    rows = []
    for loss in args.loss:
        for method in args.methods if args.hidden_size else ("plain", "chunked"):
            result = measure(args, n, loss, method)
            print(f"  measured N={n} {loss} {method}: {result}", file=sys.stderr, flush=True)
            rows.append({"n": n, "loss": loss, "method": method, "result": result})
    return rows


def search_n(args: argparse.Namespace) -> list[dict]:
    """Doubles N while the plain version survives and its projected next peak fits in memory."""
    rows, n = [], args.n_start
    while True:
        batch = run_n(args, n)
        rows += batch
        plain = [r["result"] for r in batch if r["method"] == "plain"]
        if not plain or any(r is None for r in plain):
            print(f"  stop: plain failed at N={n}", file=sys.stderr)
            break
        budget_mb = args.mem_frac * _mem_available_mb()
        # Peaks grow linearly in N: the next N's extra is twice this one's.
        projected = max(r["peak_mb"] + r["extra_mb"] for r in plain)
        if projected > budget_mb:
            print(f"  stop: plain at N={2 * n} would need ~{projected:.0f} MB "
                  f"> budget {budget_mb:.0f} MB", file=sys.stderr)
            break
        n *= 2
    return rows


def print_table(rows: list[dict], device: str) -> None:
    """Side-by-side table plus chunked/plain ratios from the same run."""
    unit = "peak MB (cuda alloc)" if device.startswith("cuda") else "peak MB (VmHWM)"
    print(f"\n{'N':>6} {'loss':>7} {'method':>8} {unit:>21} {'extra MB':>9} {'seconds':>8} "
          f"{'loss value':>11}")
    for r in rows:
        res = r["result"]
        if res is None:
            print(f"{r['n']:>6} {r['loss']:>7} {r['method']:>8} {'failed':>21}")
            continue
        print(f"{r['n']:>6} {r['loss']:>7} {r['method']:>8} {res['peak_mb']:>21.0f} "
              f"{res['extra_mb']:>9.0f} {res['seconds']:>8.2f} {res['loss']:>11.6f}")
    print(f"\n{'N':>6} {'loss':>7} {'method':>8}  / plain: {'peak':>6} {'extra':>6} {'time':>6}")
    by_key = {(r["n"], r["loss"], r["method"]): r["result"] for r in rows}
    for (n, loss, method), res in by_key.items():
        plain = by_key.get((n, loss, "plain"))
        if method == "plain" or plain is None or res is None:
            continue
        print(f"{n:>6} {loss:>7} {method:>8}  {'':>7} {res['peak_mb'] / plain['peak_mb']:>6.3f} "
              f"{res['extra_mb'] / plain['extra_mb']:>6.3f} "
              f"{res['seconds'] / plain['seconds']:>6.2f}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--n", type=int, nargs="+", default=DEFAULT_N, help="chain starts N")
    parser.add_argument("--search", action="store_true",
                        help="double N from --n-start until the plain version no longer fits")
    parser.add_argument("--n-start", type=int, default=32, help="first N of --search")
    parser.add_argument("--vocab", type=int, default=151_936, help="vocabulary V (Qwen's)")
    parser.add_argument("--k", type=int, default=5, help="draft steps K")
    parser.add_argument("--hidden-size", type=int, default=2048,
                        help="D of hidden-state inputs and a (V, D) lm_head; 0 = (N, K, V) logits inputs")
    parser.add_argument("--methods", nargs="+", default=["plain", "fused"], choices=list(METHODS),
                        help="methods to run with hidden-state inputs (logits inputs: plain and chunked)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default="float32", help="logits dtype")
    parser.add_argument("--temperature", type=float, default=1.0, help="softmax temperature")
    parser.add_argument("--loss", nargs="+", default=["e2e_tv"], choices=["ce", "tv", "e2e_tv"],
                        help="losses to run")
    parser.add_argument("--mem-frac", type=float, default=0.8,
                        help="memory budget as a fraction of MemAvailable: each CPU run's "
                             "address-space limit, and where --search stops")
    parser.add_argument("--method", choices=sorted(METHODS), help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mem-limit-mb", type=float, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(run_worker(args)))
        return
    print(f"V={args.vocab} K={args.k} D={args.hidden_size or '- (logits inputs)'} device={args.device} "
          f"dtype={args.dtype} threads={torch.get_num_threads()} load={os.getloadavg()[0]:.1f} "
          f"losses={args.loss}; forward + backward, one fresh process each", flush=True)
    rows = []
    if args.search:
        with stage("bench/draft_loss.py: searching the largest N that fits"):
            rows = search_n(args)
    for n in [] if args.search else args.n:
        with stage(f"bench/draft_loss.py: N={n}"):
            rows += run_n(args, n)
    print_table(rows, args.device)


if __name__ == "__main__":
    main()
