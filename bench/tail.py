"""The tail of a GRPO rollout: tokens/s of none, rs and auto as the batch's rows finish.

    PYTHONPATH=. .venv/bin/python bench/tail.py --quick --threads 1   # B = 16, V = 128, up to 512 new tokens
    PYTHONPATH=. .venv/bin/python bench/tail.py --threads 1           # B = 32 (4 prompts x 8), V = 256, up to 1,024
    PYTHONPATH=. .venv/bin/python bench/tail.py --quick --threads 1 --num-drafts 2   # + rs with 2 chains a row

A random Qwen3 (nothing is downloaded) whose next-token distribution is nearly flat over its V tokens,
one of them EOS: each row stops with probability about 1/V a token, so completion lengths are about
geometric with mean V (capped at --max-new-tokens) and the rows of one batch end at very different
lengths, as a GRPO batch's do. The MTP head is warm-started from the last layer (untrained).

Each mode decodes ``--calls`` batches in a row (the steps of an RL run: auto's chooser keeps what it
learnt, completion lengths included, from one call to the next); the last call is reported. Its decode
steps are grouped by how many rows were still active (B, B/2, ..., 1): each group's tokens/s is its
tokens over its seconds, and the mode auto ran in those steps is named. Modes run in turn, repeated
``--repeats`` times; the table gives the median tok/s and rs/none with [min, max] over the repeats.
``--num-drafts n`` adds the mode ``rs n=n`` (rs with n drafted chains a row, ``SpecConfig(num_drafts=n)``),
reported the same way, over none and over rs (one chain).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

import torch

if __package__ in (None, ""):  # run as a script: the repository root on the path for `bench.*`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bebop.mtp.head import MtpHead  # noqa: E402
from bebop.speculative import SamplingParams, SpecConfig  # noqa: E402
from bebop.speculative.auto import generate as auto_generate  # noqa: E402
from bebop.speculative.auto.chooser import AutoChooser  # noqa: E402
from bebop.speculative.engine import Decoder  # noqa: E402
from bebop.utils.progress import stage  # noqa: E402
from bench.scale import IdTokenizer  # noqa: E402

PROMPT_TOKENS = 16  # prompt length of every row
EOS_ID = 1  # the token that ends a row
SPECULATE_K = 3  # rs's K; auto chooses among none, to and rs at K = 1..4
MODES = ("none", "rs", "auto")
DEFAULTS = {"rows": 32, "vocab": 256, "max_new_tokens": 1024, "repeats": 2}
QUICK = {"rows": 16, "vocab": 128, "max_new_tokens": 512, "repeats": 1}


class EosTokenizer(IdTokenizer):
    """``bench.scale``'s id tokenizer with an EOS."""

    eos_token_id = EOS_ID


class RecordingDecoder(Decoder):
    """A ``Decoder`` that records, for every step, the tokens it emitted and the mode it ran in."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.emitted: list[int] = []
        self.modes: list[str] = []

    def step(self) -> tuple[int, float, float]:
        before, mode = self.num_tokens(), (self.runner.spec.mode if self.runner.k else "none")
        out = super().step()
        self.emitted.append(self.num_tokens() - before)
        self.modes.append(mode if mode == "none" else f"{mode} K={self.runner.k}")
        return out


def build(vocab: int, hidden: int, layers: int, max_new: int):
    """A random Qwen3 of the given size (GQA 2:1, head dim 32, MLP 3 x hidden) and its untrained head."""
    import transformers

    torch.manual_seed(0)
    heads = max(hidden // 32, 2)
    config = transformers.Qwen3Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads // 2, head_dim=32, tie_word_embeddings=True,
        max_position_embeddings=PROMPT_TOKENS + max_new + 8, pad_token_id=0, eos_token_id=EOS_ID, bos_token_id=None)
    model = transformers.Qwen3ForCausalLM(config).eval()
    head = MtpHead(model).eval()
    for p in [*model.parameters(), *head.parameters()]:
        p.requires_grad_(False)
    return model, head


def decode_call(model, head, mode: str, rows: int, max_new: int, call: int, chooser: AutoChooser | None):
    """One batch (``call`` seeds its prompts and sampling) -> the decoder, with its per-step records."""
    g = torch.Generator().manual_seed(call)
    prompts = torch.randint(2, model.config.vocab_size, (rows, PROMPT_TOKENS), generator=g).tolist()
    sampling = SamplingParams(temperature=1.0, max_new_tokens=max_new)
    made = []

    def record(*args, **kwargs):  # NOTE: generate_auto builds its own Decoder; this keeps a handle on it
        made.append(RecordingDecoder(*args, **kwargs))
        return made[-1]

    if mode == "auto":
        with mock.patch.object(auto_generate, "Decoder", record):
            auto_generate.generate_auto(model, EosTokenizer(), prompts, mtp=head, sampling=sampling, seed=call,
                                        chooser=chooser)
        return made[0]
    drafts = int(mode.split("n=")[1]) if "n=" in mode else 1  # "rs n=2": rs with 2 chains a row
    decoder = record(model, EosTokenizer(), prompts, mtp=head if mode != "none" else None, sampling=sampling,
                     spec=SpecConfig(mode.split()[0], SPECULATE_K, num_drafts=drafts), seed=call)
    while decoder.num_active:
        decoder.step()
    return decoder


def phases(decoder: RecordingDecoder, rows: int) -> list[dict]:
    """The call's steps grouped by active rows: (rows, rows/2], (rows/2, rows/4], ..., [1, 1]."""
    edges = []
    top = rows
    while top >= 1:
        edges.append(top)
        top //= 2
    groups = {e: {"tokens": 0, "seconds": 0.0, "steps": 0, "modes": set()} for e in edges}
    for (active, seconds, _), tokens, mode in zip(decoder.step_times, decoder.emitted, decoder.modes):
        edge = min(e for e in edges if e >= active)
        group = groups[edge]
        group["tokens"] += tokens
        group["seconds"] += seconds
        group["steps"] += 1
        group["modes"].add(mode)
    return [{"rows": e, **g} for e, g in groups.items()]


def run(model, head, args) -> dict[str, list[dict]]:
    """Each mode's last call, repeat by repeat -> {mode: [{"phases", "seconds", "tokens", "accept"}, ...]}."""
    modes = MODES + tuple(f"rs n={n}" for n in args.num_drafts)
    out: dict[str, list[dict]] = {m: [] for m in modes}
    for repeat in range(args.repeats):
        for mode in modes:
            chooser = AutoChooser() if mode == "auto" else None
            for call in range(args.calls):
                with stage(f"bench/tail.py: repeat {repeat + 1}, {mode}, batch {call + 1}/{args.calls}"):
                    start = time.perf_counter()
                    decoder = decode_call(model, head, mode, args.rows, args.max_new_tokens, call, chooser)
                    seconds = time.perf_counter() - start
            stats = decoder.result().spec_metrics()
            out[mode].append({"phases": phases(decoder, args.rows), "seconds": seconds,
                              "tokens": decoder.num_tokens(), "accept": stats.get("spec/accept_length"),
                              "lengths": sorted(len(t) for t in decoder.runner.outputs)})
            print(f"repeat {repeat + 1}/{args.repeats} {mode}: {out[mode][-1]['tokens'] / seconds:.1f} tok/s "
                  f"over the call ({seconds:.1f} s)", flush=True)
    return out


def _rate(phase: dict) -> float:
    return phase["tokens"] / phase["seconds"] if phase["seconds"] else float("nan")


def _median(values: list[float]) -> str:
    values = [v for v in values if v == v]  # NOTE: a group with no step of a mode is nan
    return f"{statistics.median(values):.1f}" if values else "-"


def _spread(values: list[float]) -> str:
    values = [v for v in values if v == v]
    if not values:
        return "-"
    return f"{statistics.median(values):.2f}× [{min(values):.2f}, {max(values):.2f}]"


def report(results: dict[str, list[dict]], rows: int) -> list[str]:
    """The table: per group of active rows, tok/s of each mode (median), each over none (and an ``rs n=``
    mode over rs too), auto's modes."""
    modes = list(results)
    ratios = [(m, "none") for m in modes if m != "none"] + [(m, "rs") for m in modes if m.startswith("rs n=")]
    lines = [f"| active rows | steps {' / '.join(modes)} | " + " | ".join(f"{m} tok/s" for m in modes) + " | "
             + " | ".join(f"{a} / {b}" for a, b in ratios) + " | auto ran |",
             "|---|---|" + "---|" * (len(modes) + len(ratios) + 1)]

    def cells(rate: dict[str, list[float]]) -> str:
        return " | ".join(_spread([x / y for x, y in zip(rate[a], rate[b])]) for a, b in ratios)

    for i, edge in enumerate(results["none"][0]["phases"]):
        low = edge["rows"] // 2 + 1
        label = f"{low}-{edge['rows']}" if low < edge["rows"] else str(edge["rows"])
        rate = {m: [_rate(r["phases"][i]) for r in results[m]] for m in modes}
        steps = " / ".join(str(results[m][0]["phases"][i]["steps"]) for m in modes)
        ran = sorted(set().union(*(r["phases"][i]["modes"] for r in results["auto"]))) or ["-"]
        lines.append(f"| {label} | {steps} | " + " | ".join(_median(rate[m]) for m in modes)
                     + f" | {cells(rate)} | {', '.join(ran)} |")
    whole = {m: [r["tokens"] / r["seconds"] for r in results[m]] for m in modes}
    lines.append("| whole call | | " + " | ".join(f"{statistics.median(whole[m]):.1f}" for m in modes)
                 + f" | {cells(whole)} | |")
    accept = [r["accept"] for r in results["rs"] if r["accept"]]
    lengths = results["none"][0]["lengths"]
    lines += ["", f"rs accept length {statistics.median(accept):.2f}; completion lengths (none, first repeat): "
                  f"min {lengths[0]}, median {lengths[len(lengths) // 2]}, max {lengths[-1]} of {rows} rows"]
    for m in modes[len(MODES):]:
        lines.append(f"{m} accept length {statistics.median(r['accept'] for r in results[m] if r['accept']):.2f}")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--quick", action="store_true", help="defaults B = 16, V = 128, up to 512 new tokens, 1 repeat")
    ap.add_argument("--rows", type=int, help="B, rows of a batch (GRPO: prompts x group size); default 32")
    ap.add_argument("--max-new-tokens", type=int, help="completion length cap; default 1024")
    ap.add_argument("--vocab", type=int, help="V: rows stop with probability about 1/V a token; default 256")
    ap.add_argument("--hidden-size", type=int, default=256, help="D of the random model")
    ap.add_argument("--layers", type=int, default=4, help="decoder layers of the random model")
    ap.add_argument("--calls", type=int, default=2, help="batches decoded per mode; the last is reported")
    ap.add_argument("--repeats", type=int, help="times the modes run in turn; default 2")
    ap.add_argument("--num-drafts", type=int, nargs="+", default=[], help="also rs with n chains a row, per n")
    ap.add_argument("--threads", type=int, default=0, help="torch threads; 0 = torch's default")
    args = ap.parse_args(argv)
    for key, value in (QUICK if args.quick else DEFAULTS).items():  # NOTE: --quick sets what was not given
        if getattr(args, key) is None:
            setattr(args, key, value)
    if any(n < 1 for n in args.num_drafts):
        ap.error("--num-drafts must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    model, head = build(args.vocab, args.hidden_size, args.layers, args.max_new_tokens)
    print(f"# bench/tail.py | torch {torch.__version__} | {torch.get_num_threads()} thread(s) | load "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs | B = {args.rows}, V = {args.vocab}, D = "
          f"{args.hidden_size}, {args.layers} layers, max {args.max_new_tokens} new tokens, rs K = {SPECULATE_K}, "
          f"calls {args.calls}, repeats {args.repeats}\n",
          flush=True)
    start = time.time()
    lines = report(run(model, head, args), args.rows)
    print("\n" + "\n".join(lines))
    print(f"\n# {time.time() - start:.0f} s in all; load {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
