"""Rollout throughput: Bebop's engine (none / to / rs) beside HF generate, with the speedup limit.

    PYTHONPATH=. .venv/bin/python bench/rollout.py --quick          # ~1-2 min on 2 quiet CPU cores
    PYTHONPATH=. .venv/bin/python bench/rollout.py                  # ~10 min: K 1-4, B 1/16/64, T 0/1
    PYTHONPATH=. .venv/bin/python bench/rollout.py --model DIR --mtp DIR --json rows.json
    PYTHONPATH=. .venv/bin/python bench/rollout.py --modes --no-hf --batch-sizes 1 16 64 --step-profile 3
                                                                    # + an rs K=3 step phase by phase
    PYTHONPATH=. .venv/bin/python bench/rollout.py --filtered --batch-sizes 16 --ks 3 --temperatures 1 --no-hf
                                                                    # + rs at top-k 20 / top-p 0.9, q filtered or not
    PYTHONPATH=. .venv/bin/python bench/rollout.py --block --modes rs --ks 3 --temperatures 1 0.7 --no-hf
                                                                    # + rs with block verification ("rs block" rows)
    PYTHONPATH=. .venv/bin/python bench/rollout.py --modes rs --ks 3 --temperatures 1 --batch-sizes 32 \
        --group-size 8 --step-profile 3 --threads 1                 # bench/trl_step.py's rollouts: 4 prompts x 8

Defaults: the embedded model and its e2e-TV head (both trained and cached on first use).

Terms (K = speculation depth, B = batch rows, T = temperature):
    tok/s           completion tokens (EOS included) per second of wall time of one call.
    accept length   1 + E[L]: tokens emitted per verify step (``stats.accept_length``).
    c               cost of one chained draft step / cost of one target verify step, both timed
                    here at batch B with a KV cache of realistic length (longest prompt +
                    max_new_tokens / 2), medians (or minima) of repeats taken side by side.
                    Each side is what the engine runs per forward: cache.begin + attention_bias
                    + the forward + lm_head (draft: ``MtpHead.forward_step`` + ``logits``;
                    verify: the target over K+1 tokens). Sampling and verification are left
                    out, so their cost shows up as achieved/limit < 1.
    limit           (1 + E[L]) / (1 + K c): the speedup over plain decoding if a verify step cost
                    one plain step and nothing but the forwards took time (Leviathan et al. 2023).
    speedup         tok/s of the row / tok/s of ``none`` at the same (B, T), as printed.
    verify/plain    verify forward over K+1 tokens / plain forward over 1 token; above 1 the
                    limit is optimistic by that factor.
    filtered rows   (--filtered) none and rs at top-k 20 / top-p 0.9, rs with q as is or cut by the
                    same top-k/top-p (``SpecConfig.filter_drafts``); alpha_RS per depth from the
                    engine's statistics.
    rs block        (--block) rs whose drafted chain is verified jointly (``SpecConfig.verify="block"``,
                    ``bebop.speculative.block``): same drafts and forwards, more accepted tokens.
    step gain       decode steps of ``none`` / decode steps of the row. Rows advance in lockstep,
                    so a call takes as many steps as its slowest row: at B > 1 the step gain is
                    below the accept length even before any cost is counted.
Roughly, achieved/limit = (step gain / accept length) / (verify/plain) * (share of a step spent
in the timed forwards); ``--step-profile`` shows where the rest goes, phase by phase, and ``--profile``
function by function.

Fairness: every configuration of a (B, T) group runs once per repeat, in alternating order
(A B C, C B A, ...), so slow phases of a shared machine hit all of them alike; medians of repeats
(or best-of with --stat min).
HF ``generate`` gets the same left-padded prompts, temperature, max_new_tokens and EOS, with
top_k/top_p off as in Bebop's defaults; its tokens are counted up to each row's first EOS.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import json
import os
import pstats
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

import torch
import transformers

from bebop.embedded import ensure_embedded_head
from bebop.models import load_model
from bebop.mtp.head import MtpHead
from bebop.speculative import SamplingParams, SpecConfig, engine, generate
from bebop.speculative.target import Target  # the engine's own verify forward, timed as the engine runs it
from bebop.speculative.kv_cache import RaggedKVCache
from bebop.task import arith
from bebop.utils.progress import stage
from bench.step_profile import profile_table

PROMPT_SEED = 0  # problems drawn for the prompts
SAMPLING_SEED = 0  # Bebop's row seeds and HF's torch.manual_seed: the same tokens every repeat
COST_REPEATS = 15  # timed calls per forward kind in the c measurement (median taken)
WARMUP_TOKENS = 4  # max_new_tokens of the untimed warmup call of each configuration
FILTER_TOP_K, FILTER_TOP_P = 20, 0.9  # the --filtered rows' sampling filter
QUICK = {"batch_sizes": [1, 16], "ks": [1, 3], "temperatures": [0.0, 1.0], "repeats": 5}


@dataclass(frozen=True)
class Method:
    """One thing that generates: Bebop's engine in a mode, or HF generate."""

    name: str  # none | to | rs | hf | hf_mtp
    k: int = 0  # speculation depth; 0 for none/hf
    filter_drafts: bool = False  # SpecConfig.filter_drafts (q cut by the target's top-k/top-p)
    verify: str = "token"  # SpecConfig.verify: token | block (rs only)


@dataclass
class Row:
    """Results of one method at one (B, T)."""

    method: str
    k: int
    batch_size: int
    temperature: float
    filter_drafts: bool = False
    top_k: int = 0  # sampling top-k (0 = off)
    top_p: float = 1.0  # sampling top-p (1 = off)
    tokens: int = 0  # completion tokens of one call (the same every repeat)
    steps: int = 0  # decode steps of one Bebop call (batch-wide: the slowest row sets it)
    seconds: list[float] = field(default_factory=list)  # one per repeat
    tok_per_s: float = 0.0  # median (or best, --stat min) over repeats
    speedup: float = float("nan")  # tok_per_s / none's tok_per_s at the same (B, T)
    step_gain: float = float("nan")  # decode steps of none / of this row: the speedup if all steps cost alike
    accept_length: float = float("nan")
    c: float = float("nan")
    verify_over_plain: float = float("nan")
    limit: float = float("nan")
    achieved_over_limit: float = float("nan")
    greedy_match: float = float("nan")  # T=0: fraction of rows whose tokens equal none's
    metrics: dict = field(default_factory=dict)  # stats.to_metrics() (speculative rows)
    verify: str = "token"  # token | block (SpecConfig.verify)

    @property
    def label(self) -> str:
        """The method as printed: "rs block" for block-verified rs rows."""
        return f"{self.method} block" if self.verify == "block" else self.method


# ----------------------------------------------------------------------------- setup


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    ap.add_argument("--model", default=None, help="HF model directory (default: the embedded model)")
    ap.add_argument("--mtp", default=None, help="MTP head directory (default: the embedded e2e_tv head)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64], help="rows B per call")
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3, 4], help="speculation depths K")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0], help="T; 0 = greedy")
    ap.add_argument("--modes", nargs="*", default=["to", "rs"], choices=["to", "rs"],
                    help="speculative modes (none and HF always run; pass --modes alone for none vs HF only)")
    ap.add_argument("--max-new-tokens", type=int, default=48, help="completion tokens per row, EOS included")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per configuration")
    ap.add_argument("--stat", default="median", choices=["median", "min"],
                    help="summary of the repeats: median, or min (best-of: steadier when other jobs burst "
                         "on a shared machine, since noise only ever adds time)")
    ap.add_argument("--quick", action="store_true",
                    help="B 1/16, K 1/3, T 0/1, 5 repeats (~1 min); overrides those flags")
    ap.add_argument("--no-hf", action="store_true", help="skip HF generate")
    ap.add_argument("--block", action="store_true",
                    help="also run rs with block verification (SpecConfig.verify='block') at every K: rows 'rs block'")
    ap.add_argument("--filtered", action="store_true",
                    help=f"also run none and rs at top-k {FILTER_TOP_K} / top-p {FILTER_TOP_P} (T > 0 only), "
                         "with drafts from q as is and from q filtered the same way")
    ap.add_argument("--group-size", type=int, default=1, metavar="G",
                    help="each distinct prompt G times in a row, as GRPO samples a group (B / G distinct prompts)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads; 0 = torch's default")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    ap.add_argument("--json", default=None, metavar="OUT", help="write every row and cost to this JSON file")
    ap.add_argument("--step-profile", type=int, default=0, metavar="K",
                    help="also print an rs step at depth K (T = 1) phase by phase beside a plain step at each "
                         "batch size (bench/step_profile.py)")
    ap.add_argument("--profile", default=None, metavar="MODE:K:B:T",
                    help="instead of the grid, cProfile one Bebop call (e.g. rs:3:16:1) and print the top costs")
    args = ap.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    if args.group_size < 1 or any(b % args.group_size for b in args.batch_sizes):
        ap.error(f"--group-size {args.group_size} must be at least 1 and divide every batch size {args.batch_sizes}")
    return args


def load(args: argparse.Namespace):
    """The model, its tokenizer and the MTP head, in eval mode on the chosen device."""
    model, tok = load_model(args.model, device=args.device)
    head_dir = args.mtp
    if head_dir is None:
        if args.model is not None:
            raise SystemExit("--model given without --mtp: the embedded head only fits the embedded model")
        head_dir = ensure_embedded_head("e2e_tv", model, tok)
    head = MtpHead.from_pretrained(head_dir, model).eval()
    for p in head.parameters():
        p.requires_grad_(False)
    return model, tok, head


def make_prompts(num: int, group_size: int = 1) -> list[str]:
    """``num`` prompts: ``num / group_size`` distinct ones, each repeated ``group_size`` times in a row (GRPO's groups)."""
    return [p.prompt for p in arith.make_problems(num // group_size, seed=PROMPT_SEED) for _ in range(group_size)]


def header(args, model, head, device) -> str:
    cfg = model.config.get_text_config()
    n_model = sum(p.numel() for p in model.parameters())
    n_head = sum(p.numel() for p in head.parameters())
    return (
        f"torch {torch.__version__} | transformers {transformers.__version__} | device {device} | "
        f"threads {torch.get_num_threads()} | model {cfg.model_type} {n_model / 1e6:.2f}M params "
        f"(D={cfg.hidden_size}, {cfg.num_hidden_layers} layers, V={cfg.vocab_size}) | "
        f"head {len(head.layers)} layer {n_head / 1e6:.2f}M params | max_new_tokens {args.max_new_tokens} | "
        f"repeats {args.repeats} ({args.stat}) | load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs | "
        f"OMP_WAIT_POLICY {os.environ.get('OMP_WAIT_POLICY', 'unset')}"
    )


def warn_if_busy() -> None:
    """Several torch threads on a busy machine wait at every parallel region for a descheduled thread."""
    load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    if torch.get_num_threads() > 1 and load > cpus:
        passive = os.environ.get("OMP_WAIT_POLICY", "").lower() == "passive"
        fix = "--threads 1" if passive else "--threads 1 or OMP_WAIT_POLICY=PASSIVE"
        print(f"warning: load {load:.1f} on {cpus} CPUs with {torch.get_num_threads()} torch threads; thread "
              f"barriers may dominate the timings (try {fix})", file=sys.stderr)


def run_order(names: list, repeat: int) -> list:
    """The order of a repeat's calls (``bench.auto``): a permutation drawn with seed
    ``repeat``, so no setting holds a slot. In the alternating order (A B C, C B A, ...) a fixed setting
    run in the auto choosers' slots of ``auto.py`` read 1.015x the grid's best (mean of 7 groups; it rose
    with the slot, to 1.097), 0.985x in a random order: a slot bias of ~3 points (se ~1.6) that an
    alternating order hands to whichever calls sit at the ends."""
    return random.Random(repeat).sample(names, len(names))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Speedometer:
    """The machine's speed between timed calls (``bench.auto``): the seconds of a fixed
    forward of the model over CANARY_TOKENS tokens (the canary), read after every call.

    These machines run in phases: same-seed rs2 calls at B = 16 took ~110 ms, then ~220 ms for a few
    seconds, then ~110 again, and a canary read between the calls went from 13.5 to 30 ms and back with
    them (correlation 0.96 over 60 calls). ``corrected`` divides each call's seconds by the canary around
    it (the mean of the readings before and after) over the group's median reading: the log-sd of those
    calls fell from 0.18 to 0.06. Random order spreads the slow phases over the settings on average,
    but at 40 repeats they still moved a setting's tok/s by several percent from run to run.
    """

    CANARY_TOKENS = 16  # tokens of the canary's forward (one row)
    CANARY_FORWARDS = 2  # forwards per reading (12-16 ms here: ~15% of a B = 1 call, ~5% of a B = 64 one)

    def __init__(self, model):
        self.model, self.device = model, next(model.parameters()).device
        vocab = model.config.get_text_config().vocab_size
        self.ids = torch.arange(self.CANARY_TOKENS, device=self.device).unsqueeze(0) % vocab
        self.last = self.read()

    def read(self) -> float:
        """Seconds of one reading of the canary."""
        _sync(self.device)
        start = time.perf_counter()
        with torch.no_grad():
            for _ in range(self.CANARY_FORWARDS):
                self.model(self.ids)
        _sync(self.device)
        return time.perf_counter() - start

    def around(self) -> float:
        """After a timed call: the canary around it, the mean of the readings before and after it."""
        before, self.last = self.last, self.read()
        return (before + self.last) / 2


def corrected(calls: list[tuple[float, int]], canary: list[float], reference: float) -> list[tuple[float, int]]:
    """(seconds, tokens) calls with their seconds at the speed of a ``reference`` canary: each call's
    seconds x reference / the canary around it (``Speedometer``)."""
    return [(seconds * reference / c, tokens) for (seconds, tokens), c in zip(calls, canary)]


# ----------------------------------------------------------------------------- one call


@contextlib.contextmanager
def count_decode_steps():
    """Counts the engine's decode steps (one per batch-wide target forward after prefill) in a list."""
    original = engine._Runner.decode_step
    counter = [0]

    def counted(self, rows):
        counter[0] += 1
        return original(self, rows)

    engine._Runner.decode_step = counted
    try:
        yield counter
    finally:
        engine._Runner.decode_step = original


def run_bebop(model, tok, head, prompts, method: Method, temperature: float, max_new: int,
              top_k: int = 0, top_p: float = 1.0, seed: int = SAMPLING_SEED):
    """One ``generate`` call -> (seconds, result, decode steps)."""
    device = next(model.parameters()).device
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=max_new)
    spec = SpecConfig(mode=method.name, speculate_k=max(method.k, 1), filter_drafts=method.filter_drafts,
                      verify=method.verify)
    with count_decode_steps() as steps:
        _sync(device)
        start = time.perf_counter()
        result = generate(model, tok, prompts, mtp=head, sampling=sampling, spec=spec, seed=seed)
        _sync(device)
        seconds = time.perf_counter() - start
    return seconds, result, steps[0]


def run_hf(model, tok, prompts, method: Method, temperature: float, max_new: int):
    """One HF ``model.generate`` call on left-padded prompts -> (seconds, completions as token lists, decode steps)."""
    device = next(model.parameters()).device
    tok.padding_side = "left"
    enc = tok(prompts, return_tensors="pt", padding=True).to(device)
    sample = temperature > 0
    kwargs = dict(
        max_new_tokens=max_new, do_sample=sample, temperature=temperature if sample else None,
        top_k=None, top_p=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    if method.name == "hf_mtp":
        kwargs["use_mtp"] = True
    torch.manual_seed(SAMPLING_SEED)
    _sync(device)
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(**enc, **kwargs)
    _sync(device)
    seconds = time.perf_counter() - start
    completions = []
    new_tokens = out[:, enc["input_ids"].shape[1]:]
    for row in new_tokens.tolist():
        end = row.index(tok.eos_token_id) + 1 if tok.eos_token_id in row else len(row)
        completions.append(row[:end])
    return seconds, completions, new_tokens.shape[1] - 1  # forwards after prefill, as the engine counts


def hf_mtp_skip_reason(model, batch_size: int) -> str | None:
    """Why ``generate(use_mtp=True)`` cannot run here, or None when it can.

    transformers' MTPCandidateGenerator reads ``num_mtp_layers`` from the model config and loads
    the MTP weights from the model's own checkpoint (MtpModel.from_pretrained); Bebop's heads are
    separate files it cannot see. Assisted generation also raises for batch_size > 1.
    """
    if getattr(model.config.get_text_config(), "num_mtp_layers", None) is None:
        return ("HF generate(use_mtp=True) skipped: the model config has no num_mtp_layers (no native MTP "
                "weights in its checkpoint; Bebop's head is a separate file HF's MTPCandidateGenerator cannot load)")
    if batch_size > 1:
        return f"HF generate(use_mtp=True) skipped at B={batch_size}: assisted generation supports batch size 1 only"
    return None


# ----------------------------------------------------------------------------- cost ratio c


def _prefilled_caches(model, head, batch: int, kv_len: int, capacity: int):
    """The engine's target and an MTP cache, both holding kv_len positions of every row."""
    device = next(model.parameters()).device
    gen = torch.Generator(device="cpu").manual_seed(0)
    vocab = model.config.get_text_config().vocab_size
    ids = torch.randint(0, vocab, (batch, kv_len), generator=gen).to(device)
    target = Target(model, batch, capacity)
    hidden = []
    target.prefill(ids, [kv_len] * batch, lambda start, state: hidden.append(state))
    hidden = torch.cat(hidden, dim=1)  # (B, kv_len, D)
    mtp_cache = RaggedKVCache(len(head.layers), batch, capacity, device, hidden.dtype)
    positions = mtp_cache.begin(kv_len)
    g = head.forward_step(hidden, ids, positions, step=0, attention_bias=mtp_cache.attention_bias(), cache=mtp_cache)
    mtp_cache.commit([kv_len] * batch)
    return target, mtp_cache, g[:, -1:], ids[:, -1:]


@torch.inference_mode()  # as the engine runs its forwards
def measure_costs(model, head, batch: int, ks: list[int], kv_len: int, stat: str = "median") -> dict[int, dict]:
    """Seconds of one chained draft step, one verify forward over K+1 tokens and one plain forward,
    interleaved call by call at batch ``batch`` over ``kv_len`` cached positions; medians (or minima).

    Nothing is committed, so every call sees the same cache length (a hybrid's plain forward does move its
    recurrent state, which changes no cost).
    """
    device = next(model.parameters()).device
    target, mtp_cache, g, last = _prefilled_caches(model, head, batch, kv_len, kv_len + max(ks) + 2)
    verify_ids = {k: last.expand(-1, k + 1).contiguous() for k in ks}

    def draft_step():
        positions = mtp_cache.begin(1)
        out = head.forward_step(g, last, positions, step=1, attention_bias=mtp_cache.attention_bias(), cache=mtp_cache)
        head.logits(out, step=1)

    calls = {"draft": draft_step, "plain": lambda: target.forward(last)}
    calls.update({f"verify{k}": (lambda k=k: target.forward(verify_ids[k])) for k in ks})
    times: dict[str, list[float]] = {name: [] for name in calls}
    for fn in calls.values():
        fn()  # warmup
    for _ in range(COST_REPEATS):
        for name, fn in calls.items():
            _sync(device)
            start = time.perf_counter()
            fn()
            _sync(device)
            times[name].append(time.perf_counter() - start)
    summarise = min if stat == "min" else statistics.median
    med = {name: summarise(v) for name, v in times.items()}
    return {
        k: {"kv_len": kv_len, "draft_s": med["draft"], "verify_s": med[f"verify{k}"], "plain_s": med["plain"],
            "c": med["draft"] / med[f"verify{k}"], "verify_over_plain": med[f"verify{k}"] / med["plain"]}
        for k in ks
    }


# ----------------------------------------------------------------------------- one (B, T) group


def run_group(model, tok, head, methods: list[Method], batch: int, temperature: float, args,
              top_k: int = 0, top_p: float = 1.0) -> list[Row]:
    """Every method at (B, T): one short warmup each, then ``repeats`` interleaved timed calls."""
    prompts = make_prompts(batch, args.group_size)
    rows = {m: Row(m.name, m.k, batch, temperature, m.filter_drafts, top_k, top_p, verify=m.verify) for m in methods}
    outputs = {}

    def call(m: Method, max_new: int):
        if m.name in ("hf", "hf_mtp"):
            return run_hf(model, tok, prompts, m, temperature, max_new)
        return run_bebop(model, tok, head, prompts, m, temperature, max_new, top_k, top_p)

    for m in methods:
        call(m, min(WARMUP_TOKENS, args.max_new_tokens))
    for r in range(args.repeats):
        for m in methods if r % 2 == 0 else methods[::-1]:
            seconds, out, steps = call(m, args.max_new_tokens)
            rows[m].seconds.append(seconds)
            rows[m].steps = steps
            outputs[m] = out
    for m, row in rows.items():
        out = outputs[m]
        tokens = out if isinstance(out, list) else out.token_ids
        row.tokens = sum(len(t) for t in tokens)
        row.tok_per_s = row.tokens / min(row.seconds) if args.stat == "min" else statistics.median(
            row.tokens / s for s in row.seconds)
        if not isinstance(out, list) and m.k:
            row.accept_length = out.stats.accept_length
            row.metrics = out.stats.to_metrics()
    _compare_with_none(rows, outputs, temperature)
    return list(rows.values())


def _compare_with_none(rows: dict[Method, Row], outputs: dict, temperature: float) -> None:
    """Speedups over ``none`` and, at T=0, whether the tokens equal none's."""
    base = rows[Method("none")]
    base_tokens = outputs[Method("none")].token_ids
    for m, row in rows.items():
        row.speedup = row.tok_per_s / base.tok_per_s
        if row.steps:
            row.step_gain = base.steps / row.steps
        if temperature == 0:
            out = outputs[m]
            tokens = out if isinstance(out, list) else out.token_ids
            row.greedy_match = sum(a == b for a, b in zip(tokens, base_tokens)) / len(base_tokens)


def add_limits(rows: list[Row], costs: dict[int, dict]) -> None:
    for row in rows:
        if row.k and row.method in ("to", "rs"):
            cost = costs[row.k]
            row.c, row.verify_over_plain = cost["c"], cost["verify_over_plain"]
            row.limit = row.accept_length / (1 + row.k * row.c)
            row.achieved_over_limit = row.speedup / row.limit


# ----------------------------------------------------------------------------- output


def _f(x: float, fmt: str = ".2f") -> str:
    return "" if x != x else format(x, fmt)  # NaN -> blank


def _ms_per_step(row: Row) -> float:
    """Milliseconds per forward of one call (decode steps + prefill), from the summarised tok/s."""
    return row.tokens / row.tok_per_s * 1e3 / (row.steps + 1)


def format_tables(rows: list[Row], costs: dict[int, dict[int, dict]], stat: str) -> str:
    lines = ["### Speculative decoding vs plain (`none`), same (B, T)", "",
             "| B | T | mode | K | tok/s | accept len | c | limit | speedup | achieved/limit | verify/plain "
             "| steps | step gain |",
             "|---:|---:|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r.method in ("none", "to", "rs") and not r.top_k and r.top_p == 1:
            k = str(r.k) if r.k else ""
            lines.append(
                f"| {r.batch_size} | {r.temperature:g} | {r.label} | {k} | {r.tok_per_s:.0f} | "
                f"{_f(r.accept_length)} | {_f(r.c, '.3f')} | {_f(r.limit)} | {_f(r.speedup)} | "
                f"{_f(r.achieved_over_limit)} | {_f(r.verify_over_plain)} | {r.steps} | {_f(r.step_gain)} |"
            )
    lines += format_filtered(rows)
    hf = [r for r in rows if r.method in ("hf", "hf_mtp")]
    if hf:
        lines += ["", "### Plain decoding vs HF `generate` (target: none/HF >= 1)", "",
                  "At T > 0 the two draw different samples, so a batch's longest row (which sets its number of "
                  "steps) differs; ms/step compares the loops themselves.", "",
                  "| B | T | method | tok/s | none tok/s | none/HF | steps HF / none | ms/step HF / none | "
                  "none/HF per step |", "|---:|---:|:---|---:|---:|---:|---:|---:|---:|"]
        none = {(r.batch_size, r.temperature): r for r in rows if r.method == "none"}
        for r in hf:
            base = none[(r.batch_size, r.temperature)]
            ms_hf, ms_none = (_ms_per_step(x) for x in (r, base))
            lines.append(f"| {r.batch_size} | {r.temperature:g} | {r.method} | {r.tok_per_s:.0f} | "
                         f"{base.tok_per_s:.0f} | {_f(1 / r.speedup)} | {r.steps} / {base.steps} | "
                         f"{ms_hf:.2f} / {ms_none:.2f} | {ms_hf / ms_none:.2f} |")
    lines += ["", f"### Forward costs behind c ({'minima' if stat == 'min' else 'medians'} of "
              f"{COST_REPEATS}, ms)", "",
              "| B | KV len | draft step | plain (1 tok) | K | verify (K+1 tok) | c | verify/plain |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for batch, per_k in costs.items():
        for k, c in per_k.items():
            lines.append(f"| {batch} | {c['kv_len']} | {c['draft_s'] * 1e3:.2f} | {c['plain_s'] * 1e3:.2f} | {k} | "
                         f"{c['verify_s'] * 1e3:.2f} | {c['c']:.3f} | {c['verify_over_plain']:.2f} |")
    return "\n".join(lines)


def format_filtered(rows: list[Row]) -> list[str]:
    """The --filtered rows: alpha_RS per depth, accept length and tok/s with q as is or filtered."""
    filtered = [r for r in rows if r.top_k or r.top_p < 1]
    if not filtered:
        return []
    lines = ["", f"### Filtered drafts: top-k {FILTER_TOP_K} / top-p {FILTER_TOP_P} (speedup over none at the same "
             "filter)", "", "| B | T | mode | K | q filtered | alpha_RS per depth | accept len | tok/s | speedup |",
             "|---:|---:|:---|---:|:---|:---|---:|---:|---:|"]
    for r in filtered:
        alpha = " ".join(f"{a:.3f}" for a in r.metrics.get("spec/alpha_rs", []))
        lines.append(f"| {r.batch_size} | {r.temperature:g} | {r.method} | {r.k or ''} | "
                     f"{'yes' if r.filter_drafts else 'no' if r.k else ''} | {alpha} | {_f(r.accept_length)} | "
                     f"{r.tok_per_s:.0f} | {_f(r.speedup)} |")
    return lines


def format_notes(rows: list[Row], notes: list[str]) -> str:
    out = list(notes)
    bad = [r for r in rows if r.greedy_match == r.greedy_match and r.greedy_match < 1]
    for r in bad:
        out.append(f"T=0 {r.method} K={r.k} B={r.batch_size}: only {r.greedy_match:.0%} of rows equal plain greedy "
                   "(speculative greedy must reproduce it; HF may differ by float rounding)")
    if not bad and any(r.greedy_match == r.greedy_match for r in rows):
        out.append("T=0: every method's tokens equal plain greedy decoding, row for row.")
    # NOTE: at T=0 `to` and `rs` run the same greedy code path, so their tok/s differ by noise only.
    by_key = {(r.method, r.k, r.batch_size): r for r in rows if r.temperature == 0}
    gaps = [abs(r.tok_per_s / by_key[("rs", r.k, r.batch_size)].tok_per_s - 1)
            for r in rows if r.temperature == 0 and r.method == "to" and ("rs", r.k, r.batch_size) in by_key]
    if gaps:
        out.append(f"noise gauge: at T=0 `to` and `rs` are the same computation; their tok/s differ by "
                   f"{statistics.median(gaps):.0%} (median), {max(gaps):.0%} (max) in this run.")
    return "\n".join(f"- {n}" for n in out)


def profile_one(model, tok, head, spec: str, max_new: int, top: int = 25) -> None:
    """cProfile of one Bebop ``generate`` call (after a warmup call), top functions by own time."""
    mode, k, batch, temperature = spec.split(":")
    method, prompts = Method(mode, int(k)), make_prompts(int(batch))
    run_bebop(model, tok, head, prompts, method, float(temperature), max_new)
    profiler = cProfile.Profile()
    profiler.enable()
    seconds, result, steps = run_bebop(model, tok, head, prompts, method, float(temperature), max_new)
    profiler.disable()
    print(f"{spec}: {seconds * 1e3:.0f} ms under cProfile, {sum(result.lengths)} tokens, {steps} decode steps, "
          f"accept length {result.stats.accept_length:.2f}")
    stats = pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime")
    stats.print_stats(top)


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok, head = load(args)
    device = next(model.parameters()).device
    print(f"# bench/rollout.py | {header(args, model, head, device)}\n", flush=True)
    warn_if_busy()
    if args.profile:
        profile_one(model, tok, head, args.profile, args.max_new_tokens)
        return
    notes = []
    rows: list[Row] = []
    costs: dict[int, dict[int, dict]] = {}
    start = time.perf_counter()
    for batch in args.batch_sizes:
        kv_len = max(len(tok.encode(p)) for p in make_prompts(batch, args.group_size)) + args.max_new_tokens // 2
        with stage(f"bench/rollout.py: step costs at B={batch}"):
            costs[batch] = measure_costs(model, head, batch, args.ks, kv_len, args.stat)
        methods = [Method("none")] + ([] if args.no_hf else [Method("hf")])
        skip = hf_mtp_skip_reason(model, batch)
        if skip is None and not args.no_hf:
            methods.append(Method("hf_mtp"))
        elif skip not in notes and not args.no_hf:
            notes.append(skip)
        methods += [Method(mode, k) for mode in args.modes for k in args.ks]
        methods += [Method("rs", k, verify="block") for k in args.ks] if args.block else []
        for temperature in args.temperatures:
            with stage(f"bench/rollout.py: {len(methods)} methods at B={batch} T={temperature:g}"):
                group = run_group(model, tok, head, methods, batch, temperature, args)
            add_limits(group, costs[batch])
            rows += group
            print(f"[{time.perf_counter() - start:.0f}s] done B={batch} T={temperature:g}", file=sys.stderr, flush=True)
            if args.filtered and temperature > 0:
                methods_f = [Method("none")] + [Method("rs", k, f) for k in args.ks for f in (False, True)]
                with stage(f"bench/rollout.py: filtered drafts at B={batch} T={temperature:g}"):
                    rows += run_group(model, tok, head, methods_f, batch, temperature, args, FILTER_TOP_K, FILTER_TOP_P)
                print(f"[{time.perf_counter() - start:.0f}s] done filtered B={batch} T={temperature:g}",
                      file=sys.stderr, flush=True)
    print(format_tables(rows, costs, args.stat))
    if args.step_profile:
        prompts_for = functools.partial(make_prompts, group_size=args.group_size)
        print("\n" + profile_table(model, tok, head, prompts_for, args.batch_sizes, args.step_profile, 1.0,
                                   args.max_new_tokens, min(args.repeats, 3)))
    print("\n" + format_notes(rows, notes))
    print(f"\ntotal {time.perf_counter() - start:.0f}s, load {os.getloadavg()[0]:.1f} at the end")
    if args.json:
        payload = {"header": header(args, model, head, device), "args": vars(args), "notes": notes,
                   "costs": {str(b): {str(k): c for k, c in v.items()} for b, v in costs.items()},
                   "rows": [asdict(r) for r in rows]}
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=1)


if __name__ == "__main__":
    main()
