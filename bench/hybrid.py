"""Hybrid (Gated DeltaNet and attention) against full attention: what the exact state rollback costs.

    PYTHONPATH=. .venv/bin/python bench/hybrid.py --quick --threads 1   # 3-6 min on 2 shared CPU cores
    PYTHONPATH=. .venv/bin/python bench/hybrid.py --threads 1           # wider models, more repeats
    PYTHONPATH=. .venv/bin/python bench/hybrid.py --device cuda --hidden-size 1024 --layers 8 --vocab 32768
    PYTHONPATH=. .venv/bin/python bench/hybrid.py --rollback --threads 1  # snapshot vs replay, real widths

Two Qwen3.5 text models of one size are built here with random weights: ``hybrid`` (the family's
default layer_types: three Gated DeltaNet layers to one full-attention layer) and ``full`` (every
layer full attention); same width, layers, heads, MLP and vocabulary, the lm_head scaled by
LOGIT_SCALE so next-token distributions are peaked as a trained model's are. Each gets an MTP head
trained the same way (CE, --head-steps steps over SEQUENCES of its own T = 1 samples), so both
speculate at an accept length of their own, printed beside their speed-ups.

Printed per model, side by side in one run (every setting of a batch size runs once per repeat, in
a random order):
    params          the model's parameters
    state/row       bytes of recurrent state a row keeps between steps (conv windows + states)
    snapshots/row   bytes a verify pass of K + 1 = 4 tokens holds per row until its commit
    verify/plain    a verify forward over K + 1 tokens over a plain forward, at B, K = 1..4 (medians of
                    interleaved calls, ``bench.rollout.measure_costs``)
    step cost       an rs decode step (draft, verify, commit, bookkeeping) over a plain one: the mean
                    decode step of each call below (``Completions.step_times``, prefill left out),
                    medians over repeats
    forwards        what the step's forwards alone cost, in plain steps: (verify over K + 1 + K draft
                    steps) / plain, at K = 3 from the same medians as verify/plain; verify/plain (1 + K c)
    gap             step cost - forwards: what sampling, verification, commit and bookkeeping add
    tok/s           completion tokens per second of ``none`` and ``rs`` (K = 3, T = 1), medians
    speedup         median of the per-repeat ratios rs / none, [min, max] over repeats (the noise)
    accept len      1 + accepted drafts per verify step
    step profile    an rs step's phases (draft, verify forward, sampling and verification, commit,
                    bookkeeping) beside a plain step's, per model and B (``bench.step_profile``)

With ``--rollback``, only this table: snapshot against replay rollback (``bebop.speculative.replay``)
on two random 2-layer models whose layers are all recurrent, at the real widths of Qwen3.5's Gated
DeltaNet (D 4,096; 32 value and 16 key heads of 128) and Nemotron-H's Mamba2 (D 4,096; 128 heads of
64, state 128, 8 groups), MLPs and vocabulary small (they are not what differs). Per B, after a
prefill of 8 tokens, verify passes of K + 1 = 4 tokens whose rows keep 1..4, each followed by its commit:
    held            bytes the pass holds until its commit beyond the committed state: every position's
                    state and the conv inputs (snapshot), the conv inputs and recorded projections (replay)
    ms              the pass and its commit, median of the repeats (the two modes alternate)
    replay/snapshot the ratios of the two
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
import transformers

from bebop.mtp.data import Sequences
from bebop.mtp.head import MtpHead
from bebop.mtp.train import TrainMtpConfig, train_mtp
from bebop.speculative import SamplingParams, generate
from bebop.speculative.target import Target
from bebop.utils.progress import stage
from bench.rollout import Method, measure_costs, run_bebop, run_order
from bench.step_profile import profile_table

LOGIT_SCALE = 4.0  # lm_head multiplier: peaked next-token distributions (random init is near uniform)
SEQUENCES = 96  # self-generated sequences each head trains on
PROMPT_SEED = 0
SPECULATE_K = 3  # rs's K in the tok/s rows; verify/plain covers 1..4
COST_KS = [1, 2, 3, 4]
ROLLBACK_WIDTHS = {  # family -> (config class, model class, config fields): 2 recurrent layers at real widths
    "Qwen3.5 Gated DeltaNet": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", {
        "linear_num_value_heads": 32, "linear_num_key_heads": 16, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4}),
    "Nemotron-H Mamba2": ("NemotronHConfig", "NemotronHForCausalLM", {
        "mamba_num_heads": 128, "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4,
        "chunk_size": 128}),
}
ROLLBACK_HIDDEN = 4096  # D of both families' real models
QUICK = {"hidden_size": 128, "layers": 4, "vocab": 2048, "head_steps": 100, "repeats": 5, "max_new_tokens": 32}


class _Tokenizer:
    """What ``generate`` asks of a tokenizer, for models without one: no EOS, empty text."""

    eos_token_id = None

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return ""


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    ap.add_argument("--hidden-size", type=int, default=256, help="width D of both models")
    ap.add_argument("--layers", type=int, default=8, help="decoder layers (a multiple of 4: the hybrid is 3:1)")
    ap.add_argument("--vocab", type=int, default=8192, help="vocabulary V")
    ap.add_argument("--head-steps", type=int, default=300, help="CE steps of each model's head")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16], help="rows B per call")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="completion tokens per row")
    ap.add_argument("--repeats", type=int, default=7, help="timed calls per setting")
    ap.add_argument("--quick", action="store_true",
                    help="D 128, 4 layers, V 2048, 100 head steps, 5 repeats, 32 tokens")
    ap.add_argument("--threads", type=int, default=0, help="torch threads; 0 = torch's default")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--rollback", action="store_true", help="only the snapshot vs replay table (real widths)")
    ap.add_argument("--rollback-batch-sizes", type=int, nargs="+", default=[1, 16, 64], help="rows B, --rollback")
    ap.add_argument("--rollback-repeats", type=int, default=3, help="timed passes per mode and B, --rollback")
    args = ap.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    return args


def build_model(kind: str, args) -> torch.nn.Module:
    """A random Qwen3.5 text model: ``hybrid`` (default layer_types) or ``full`` (every layer full attention)."""
    head_dim = 32
    heads = args.hidden_size // head_dim
    config = transformers.Qwen3_5TextConfig(
        vocab_size=args.vocab, hidden_size=args.hidden_size, intermediate_size=3 * args.hidden_size,
        num_hidden_layers=args.layers, num_attention_heads=heads, num_key_value_heads=max(1, heads // 4),
        head_dim=head_dim, linear_num_value_heads=heads, linear_num_key_heads=max(1, heads // 2),
        linear_key_head_dim=head_dim, linear_value_head_dim=head_dim, max_position_embeddings=4096,
        pad_token_id=0, eos_token_id=None,
        layer_types=None if kind == "hybrid" else ["full_attention"] * args.layers,
    )
    torch.manual_seed(0)
    model = transformers.Qwen3_5ForCausalLM(config).to(args.device).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(LOGIT_SCALE)
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def make_prompts(num: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(PROMPT_SEED)
    return [torch.randint(1, vocab, (int(n),), generator=g).tolist() for n in torch.randint(8, 25, (num,), generator=g)]


def train_head(model, args) -> MtpHead:
    """An MTP head trained with CE on the model's own T = 1 samples."""
    prompts = make_prompts(SEQUENCES, args.vocab)
    out = generate(model, _Tokenizer(), prompts, sampling=SamplingParams(temperature=1.0, max_new_tokens=48), seed=1)
    data = Sequences([p + t for p, t in zip(prompts, out.token_ids)], [len(p) for p in prompts])
    cfg = TrainMtpConfig(loss="ce", steps=args.head_steps, batch_size=16, speculate_k=SPECULATE_K, save_every=0,
                         lr=3e-3, log_every=args.head_steps)
    with tempfile.TemporaryDirectory() as tmp:
        head = train_mtp(model, data, tmp, cfg, show_progress=False)
    for p in head.parameters():
        p.requires_grad_(False)
    return head.eval()


@torch.no_grad()
def state_bytes(model, args) -> tuple[int, int]:
    """(bytes of recurrent state per row, bytes a verify pass of K + 1 tokens holds per row until its commit)."""
    target = Target(model, 1, 64, recurrent_rollback="snapshot")
    ids = torch.tensor(make_prompts(1, args.vocab), device=args.device)
    target.prefill(ids, [ids.shape[1]])
    kept = target.cache.row_states.nbytes()
    target.forward(ids[:, : SPECULATE_K + 1])
    return kept, target.cache.row_states.pending_nbytes()


def run_rollouts(models: dict, heads: dict, batch: int, args) -> dict:
    """tok/s of none and rs per model at B = ``batch``, every setting once per repeat in a random order."""
    prompts = make_prompts(batch, args.vocab)
    settings = [(name, mode) for name in models for mode in ("none", "rs")]
    calls = {s: [] for s in settings}  # (seconds, mean decode step seconds) per timed call
    accept = {}
    for repeat in range(args.repeats + 1):  # repeat 0 warms up
        for name, mode in run_order(settings, repeat):
            method = Method(mode, SPECULATE_K if mode == "rs" else 0)
            took, out, _ = run_bebop(models[name], _Tokenizer(), heads[name], prompts, method, 1.0,
                                     args.max_new_tokens, seed=repeat)
            if repeat:
                calls[(name, mode)].append((took, statistics.fmean(t for _, t, _ in out.step_times)))
                if mode == "rs":
                    accept[name] = out.stats.accept_length
    rows = {}
    tokens = batch * args.max_new_tokens
    for name in models:
        none, rs = calls[(name, "none")], calls[(name, "rs")]
        ratios = [n / r for (n, _), (r, _) in zip(none, rs)]  # the same repeat's calls: paired
        per_step = {mode: statistics.median(step for _, step in calls[(name, mode)]) for mode in ("none", "rs")}
        rows[name] = {
            "step_cost": per_step["rs"] / per_step["none"],
            "none": tokens / statistics.median(t for t, _ in none), "rs": tokens / statistics.median(t for t, _ in rs),
            "speedup": statistics.median(ratios), "low": min(ratios), "high": max(ratios), "accept": accept[name],
        }
    return rows


def rollback_model(family: str, device: str) -> torch.nn.Module:
    config_name, model_name, fields = ROLLBACK_WIDTHS[family]
    config = getattr(transformers, config_name)(
        vocab_size=256, hidden_size=ROLLBACK_HIDDEN, intermediate_size=256, num_hidden_layers=2,
        layer_types=["linear_attention"] * 2, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        pad_token_id=0, eos_token_id=None, **fields)
    torch.manual_seed(0)
    return getattr(transformers, model_name)(config).to(device).eval()


@torch.inference_mode()  # as the engine runs its forwards
def measure_rollback(model, batch: int, repeats: int, device: str) -> dict:
    """{mode: (held bytes, median seconds of a verify pass and its commit)} at B = ``batch``."""
    capacity = 8 + (repeats + 1) * (SPECULATE_K + 1)
    targets = {mode: Target(model, batch, capacity, recurrent_rollback=mode) for mode in ("snapshot", "replay")}
    g = torch.Generator().manual_seed(0)
    for target in targets.values():
        target.prefill(torch.randint(1, 256, (batch, 8), generator=g).to(device), [8] * batch)
    held, seconds = {}, {mode: [] for mode in targets}
    for repeat in range(repeats + 1):  # repeat 0 warms up
        block = torch.randint(1, 256, (batch, SPECULATE_K + 1), generator=g).to(device)
        kept = [1 + (b + repeat) % (SPECULATE_K + 1) for b in range(batch)]
        for mode in run_order(list(targets), repeat):
            target = targets[mode]
            start = time.perf_counter()
            target.forward(block)
            held[mode] = target.cache.row_states.pending_nbytes()
            target.cache.commit(kept)
            if device == "cuda":
                torch.cuda.synchronize()  # NOTE: one sync per timed pass
            if repeat:
                seconds[mode].append(time.perf_counter() - start)
    return {mode: (held[mode], statistics.median(seconds[mode])) for mode in targets}


def rollback_table(args) -> None:
    print("\n| family | B | held: snapshot | replay | replay/snapshot | ms: snapshot | replay | replay/snapshot |")
    print("|---|---|---|---|---|---|---|---|")
    for family in ROLLBACK_WIDTHS:
        model = rollback_model(family, args.device)
        for batch in args.rollback_batch_sizes:
            with stage(f"bench/hybrid.py: {family}, snapshot and replay at B={batch}"):
                r = measure_rollback(model, batch, args.rollback_repeats, args.device)
            (snap_b, snap_s), (rep_b, rep_s) = r["snapshot"], r["replay"]
            print(f"| {family} | {batch} | {snap_b / 2**20:,.1f} MiB | {rep_b / 2**20:,.1f} MiB | "
                  f"{rep_b / snap_b:.3f} | "
                  f"{snap_s * 1e3:,.0f} | {rep_s * 1e3:,.0f} | {rep_s / snap_s:.2f} |", flush=True)
        del model


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    if args.rollback:
        print(f"torch {torch.__version__} | transformers {transformers.__version__} | device {args.device} | threads "
              f"{torch.get_num_threads()} | repeats {args.rollback_repeats} | load {os.getloadavg()[0]:.1f} on "
              f"{os.cpu_count()} CPUs")
        rollback_table(args)
        print(f"\ntotal {time.perf_counter() - start:.0f} s | load {os.getloadavg()[0]:.1f}")
        return
    with stage("bench/hybrid.py: two random models and their heads"):
        models = {kind: build_model(kind, args) for kind in ("hybrid", "full")}
        heads = {kind: train_head(model, args) for kind, model in models.items()}
    print(f"torch {torch.__version__} | transformers {transformers.__version__} | device {args.device} | threads "
          f"{torch.get_num_threads()} | D={args.hidden_size}, {args.layers} layers, V={args.vocab} | head "
          f"{args.head_steps} CE steps | max_new_tokens {args.max_new_tokens} | repeats {args.repeats} | load "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs | heads trained in {time.perf_counter() - start:.0f} s")
    print("\n| model | params | state/row | snapshots/row (K=3) |")
    print("|---|---|---|---|")
    for kind, model in models.items():
        kept, pending = state_bytes(model, args)
        params = sum(p.numel() for p in model.parameters())
        print(f"| {kind} | {params / 1e6:.2f}M | {kept / 1024:.1f} KiB | {pending / 1024:.1f} KiB |")
    print("\n| B | model | verify/plain K=1 | K=2 | K=3 | K=4 | plain ms | step cost | forwards | gap | none tok/s | "
          "rs tok/s | speedup [min, max] | accept len |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for batch in args.batch_sizes:
        with stage(f"bench/hybrid.py: step costs and rollouts at B={batch}"):
            costs = {kind: measure_costs(model, heads[kind], batch, COST_KS, kv_len=32)
                     for kind, model in models.items()}
            rows = run_rollouts(models, heads, batch, args)
        for kind in models:
            c, r = costs[kind], rows[kind]
            ratios = " | ".join(f"{c[k]['verify_over_plain']:.2f}" for k in COST_KS)
            k = c[SPECULATE_K]
            forwards = (k["verify_s"] + SPECULATE_K * k["draft_s"]) / k["plain_s"]
            print(f"| {batch} | {kind} | {ratios} | {c[1]['plain_s'] * 1e3:.1f} | {r['step_cost']:.2f} | "
                  f"{forwards:.2f} | {r['step_cost'] - forwards:+.2f} | {r['none']:.0f} | {r['rs']:.0f} | "
                  f"{r['speedup']:.2f}x [{r['low']:.2f}, {r['high']:.2f}] | {r['accept']:.2f} |")
    for kind, model in models.items():  # where an rs step's time goes, phase by phase
        print(f"\n{kind}:", profile_table(model, _Tokenizer(), heads[kind], lambda b: make_prompts(b, args.vocab),
                                           args.batch_sizes, SPECULATE_K, 1.0, args.max_new_tokens, 2))
    print(f"\ntotal {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
