"""Cost curves at a real model's width: time and peak memory beyond the weights of each command's core.

    PYTHONPATH=. .venv/bin/python bench/scale.py --quick            # the curves at small sizes
    PYTHONPATH=. .venv/bin/python bench/scale.py                    # larger sizes, the RL headline, B = 64
    PYTHONPATH=. .venv/bin/python bench/scale.py --only rl eval-mtp # some sections

Models are built here with random weights (nothing is downloaded): Qwen3 blocks at Qwen3-0.6B's width
(D = 1,024, 16 heads, 8 KV heads, MLP 3,072, tied embeddings) with Qwen3's vocabulary V = 151,936
(Qwen3.5's V = 248,320 in the vocabulary curves) and ``--layers`` decoder layers (2: 187 M parameters),
so the lm_head and the vocabulary are real and the body is small. Every point runs in a fresh process
(``--worker``): ``base`` is its resident memory once the model and inputs exist (the weights and
torch), ``extra`` = the process's peak (VmHWM) - base, and the seconds time the work only. Each curve
ends with its log-log slopes (time and extra memory against the size that grows): 1 is linear.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
QWEN3_VOCAB, QWEN3_5_VOCAB = 151_936, 248_320
PROMPT_TOKENS = 32  # prompt length of every row
SPECULATE_K = 3
TINY_WIDTH = dict(hidden_size=64, intermediate_size=192, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
TINY_VOCAB = 2_048  # the length curves' vocabulary: per-token costs are the sequence's, not the lm_head's
LENGTHS_QUICK = [1_024, 4_096]  # new tokens of the length curves under --quick
LENGTHS = [2_048, 4_096, 8_192, 16_384]  # new tokens of the length curves (decoding: 16k is minutes)
RL_LENGTHS = LENGTHS + [32_768]  # the RL step (one forward and backward) reaches further


# ----------------------------------------------------------------------------- the worker (one point)


def _status_mb(key: str) -> float:
    """VmRSS / VmHWM of this process in MB."""
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024
    raise KeyError(key)


def _reset_peak() -> None:
    """VmHWM := VmRSS (Linux: writing 5 to clear_refs resets the peak)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


class IdTokenizer:
    """What the engine asks of a tokenizer: no EOS (random weights rarely stop), ids written as text."""

    eos_token_id = None
    pad_token_id = 0

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return " ".join(map(str, ids))


def build_model(vocab: int, layers: int, arch: str = "qwen3", tiny: bool = False, positions: int = 8192):
    """A random causal LM at Qwen3-0.6B's width (``tiny``: ``TINY_WIDTH``, for long sequences), with
    ``positions`` positions; arch "qwen3_5" gives Qwen3.5 text blocks (full attention)."""
    import torch
    import transformers

    torch.manual_seed(0)
    width = TINY_WIDTH if tiny else dict(hidden_size=1024, intermediate_size=3072, num_attention_heads=16,
                                          num_key_value_heads=8, head_dim=128)
    common = dict(vocab_size=vocab, num_hidden_layers=layers, tie_word_embeddings=True, **width,
                  max_position_embeddings=positions, pad_token_id=0, eos_token_id=None, bos_token_id=None)
    if arch == "qwen3_5":
        config = transformers.Qwen3_5TextConfig(**common, layer_types=["full_attention"] * layers)
        return transformers.Qwen3_5ForCausalLM(config).eval()
    return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**common)).eval()


def _random_ids(rows: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab, (rows, length), generator=g).tolist()


def _rl_point(model, p: dict) -> dict:
    """The RL step after the rollout: old logprobs, the micro-batched loss and backward, the AdamW step."""
    import torch

    from bebop.rollout import logprobs
    from bebop.rl.config import PolicyConfig
    from bebop.rl.update import accumulate_gradients, fixed_logprobs
    from bebop.utils.optim import make_adamw

    if p.get("full_logits"):  # the untiled path: the model's (rows, T, V) logits, one micro-batch
        logprobs.lm_head_of = lambda model: None
    cfg = PolicyConfig(micro_batch_tokens=p.get("micro_batch_tokens", 10**9 if p.get("full_logits") else 16_384))
    for param in model.parameters():
        param.requires_grad_(True)
    optimizer = make_adamw(model.parameters(), lr=1e-6, weight_decay=0.0)
    prompts = _random_ids(p["rows"], PROMPT_TOKENS, p["vocab"])
    inputs = logprobs.pad_sequences(prompts, _random_ids(p["rows"], p["new_tokens"], p["vocab"], seed=1), pad_id=0)
    advantages = torch.randn(p["rows"], generator=torch.Generator().manual_seed(2))
    phases, base = {}, _status_mb("VmRSS")
    start = time.perf_counter()
    old, _ = fixed_logprobs(model, None, inputs, 1.0, cfg.micro_batch_tokens)
    phases["logprobs_mb"] = _status_mb("VmHWM") - base
    _reset_peak()
    num_tokens = inputs[2].sum().float()
    accumulate_gradients(model, inputs, old, None, advantages, num_tokens, cfg, 1.0)
    phases["backward_mb"] = _status_mb("VmHWM") - base
    _reset_peak()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    optimizer.step()
    phases["adamw_step_mb"] = _status_mb("VmHWM") - base
    seconds = time.perf_counter() - start
    state = 3 * sum(q.numel() * q.element_size() for q in model.parameters()) / 2**20  # weights + 2 moments
    # NOTE: the curves' extra is the forward/backward's (what grows with the work); the AdamW step adds the
    # moments to the gradients whatever the batch (adamw_step_mb), and the headline reads the whole step's peak.
    return {"seconds": seconds, "step_peak_mb": base + max(phases.values()), "state_mb": state,
            "extra_mb": max(phases["logprobs_mb"], phases["backward_mb"]), **phases}


def _chains(p: dict):
    """A padded batch of rows x length random tokens, drafting from the first."""
    import torch

    from bebop.mtp.data import Sequences

    seqs = Sequences(_random_ids(p["rows"], p["length"], p["vocab"]), [1] * p["rows"])
    return seqs, seqs.batch(list(range(p["rows"])), 0, torch.device("cpu"))


def _train_mtp_point(model, head, p: dict) -> dict:
    """One train-mtp step: chain_loss (e2e_tv, served chains) + backward + the head's AdamW step."""
    from bebop.mtp.loss import chain_loss
    from bebop.utils.optim import make_adamw

    optimizer = make_adamw(head.parameters(), lr=1e-4, weight_decay=0.0)
    _, (ids, lengths, starts) = _chains(p)
    start = time.perf_counter()
    loss, _, _ = chain_loss(model, head, ids, lengths, starts, SPECULATE_K, "served", "e2e_tv", 1.0)
    loss.backward()
    optimizer.step()
    return {"seconds": time.perf_counter() - start}


def _eval_mtp_point(model, head, p: dict) -> dict:
    """eval-mtp over the rows; ``block_s`` is the block estimate's share of the seconds, and ``float64_block_s`` the
    time the float64-softmax estimator (``block.sampled_block_accepts``) takes on the same chains (not counted)."""
    import torch

    from bebop.mtp import evaluate
    from bebop.speculative import block

    seqs, _ = _chains(p)
    timed = {"block_s": 0.0, "float64_block_s": 0.0}
    block_sums = evaluate._block_sums

    def timed_block_sums(draft, target, temperature, generator):
        start = time.perf_counter()
        out = block_sums(draft, target, temperature, generator)
        timed["block_s"] += time.perf_counter() - start
        start = time.perf_counter()
        q, p_ = ((x.double() / temperature).softmax(-1) for x in (draft, target))
        block.sampled_block_accepts(p_, q, torch.Generator().manual_seed(0))
        timed["float64_block_s"] += time.perf_counter() - start
        return out

    evaluate._block_sums = timed_block_sums
    start = time.perf_counter()
    evaluate.evaluate_mtp(model, head, seqs, speculate_k=SPECULATE_K, batch_size=p["rows"])
    seconds = time.perf_counter() - start - timed["float64_block_s"]
    return {"seconds": seconds, "tokens": p["rows"] * p["length"], **timed}


LONG_KINDS = ("train-mtp-long", "eval-mtp-long", "online-long")  # the head's cores at tiny width, long positions
LONG_VOCAB = 8_192  # their vocabulary: the lm_head's tiles are not what these curves measure


def _long_point(p: dict) -> dict:
    """One row of ``length`` tokens (K = 3) at tiny width (D = 64, 2 layers): train-mtp's step (served chains,
    e2e_tv, AdamW), eval-mtp, or the online RL head step; base and extra MB as ``run_point``'s."""
    import torch
    import transformers

    from bebop.mtp.head import MtpHead

    torch.set_num_threads(p["threads"])
    torch.manual_seed(0)
    config = transformers.Qwen3Config(vocab_size=LONG_VOCAB, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                      tie_word_embeddings=True, max_position_embeddings=p["length"], pad_token_id=0,
                                      eos_token_id=None, bos_token_id=None)
    model = transformers.Qwen3ForCausalLM(config).eval()
    head = MtpHead(model)
    for param in model.parameters():
        param.requires_grad_(False)
    seqs, (ids, lengths, starts) = _chains({**p, "vocab": LONG_VOCAB})
    _reset_peak()
    base = _status_mb("VmRSS")
    start = time.perf_counter()
    if p["kind"] == "train-mtp-long":
        from bebop.mtp.loss import chain_loss
        from bebop.utils.optim import make_adamw

        optimizer = make_adamw(head.parameters(), lr=1e-4, weight_decay=0.0)
        loss, _, _ = chain_loss(model, head, ids, lengths, starts, SPECULATE_K, "served", "e2e_tv", 1.0)
        loss.backward()
        optimizer.step()
    elif p["kind"] == "eval-mtp-long":
        from bebop.mtp.evaluate import evaluate_mtp

        evaluate_mtp(model, head, seqs, speculate_k=SPECULATE_K, batch_size=p["rows"])
    else:
        from bebop.rl.config import MtpUpdateConfig
        from bebop.rl.online import make_head_optimizer, online_head_step

        cfg = MtpUpdateConfig(mtp_update="online", mtp_speculate_k=SPECULATE_K)
        online_head_step(model, head, make_head_optimizer(head, cfg), seqs, cfg, 1.0, 0)
    weights = sum(q.numel() * q.element_size() for q in model.parameters()) / 2**20
    return {"seconds": time.perf_counter() - start, "base_mb": base, "extra_mb": _status_mb("VmHWM") - base,
            "weights_mb": weights}


def _generate_point(model, head, p: dict) -> dict:
    """One engine generate call (mode none or rs), or HF generate with the same sampling (T = 1, no filter)."""
    import torch

    from bebop.speculative.engine import SamplingParams, SpecConfig, generate

    prompts = _random_ids(p["rows"], PROMPT_TOKENS, p["vocab"])
    if p["mode"] == "hf":
        ids = torch.tensor(prompts)
        torch.manual_seed(0)
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                                 top_k=0, top_p=1.0, max_new_tokens=p["new_tokens"], pad_token_id=0)
        return {"seconds": time.perf_counter() - start, "tokens": (out.shape[1] - ids.shape[1]) * ids.shape[0]}
    spec = SpecConfig(p["mode"], SPECULATE_K)
    start = time.perf_counter()
    result = generate(model, IdTokenizer(), prompts, mtp=head, spec=spec,
                      sampling=SamplingParams(temperature=1.0, max_new_tokens=p["new_tokens"]))
    seconds = time.perf_counter() - start
    metrics = result.spec_metrics()
    return {"seconds": seconds, "tokens": sum(result.lengths), "accept_length": metrics.get("spec/accept_length")}


def _check_lossless_point(model, p: dict) -> dict:
    """check-lossless's reference check at T = 1: samples rows of REF_TOKENS tokens, the model's forward, chi2."""
    from bebop.check.lossless import LosslessConfig
    from bebop.check.reference import run_reference_checks

    prompt = _random_ids(1, PROMPT_TOKENS, p["vocab"])[0]
    start = time.perf_counter()
    run_reference_checks(model, IdTokenizer(), [prompt], p["samples"], seed=0, alpha=1e-3,
                         configs=(LosslessConfig("rs", SPECULATE_K, 1.0),))
    return {"seconds": time.perf_counter() - start}


def _export_point(model, head, p: dict) -> dict:
    """export-mtp of a head into a saved Qwen3.5 checkpoint, then import-mtp of the result."""
    from bebop.mtp.native import export_mtp, import_mtp

    with tempfile.TemporaryDirectory(dir=p.get("tmp")) as tmp:
        model.save_pretrained(f"{tmp}/model")
        head.save_pretrained(f"{tmp}/head")
        _reset_peak()
        base = _status_mb("VmRSS")
        start = time.perf_counter()
        export_mtp(f"{tmp}/model", f"{tmp}/head", f"{tmp}/served", fmt="qwen3_5")
        export_s, export_mb = time.perf_counter() - start, _status_mb("VmHWM") - base
        _reset_peak()
        start = time.perf_counter()
        import_mtp(f"{tmp}/served", model)
        import_mb = _status_mb("VmHWM") - base
        return {"seconds": export_s + time.perf_counter() - start, "export_s": export_s, "export_mb": export_mb,
                "import_mb": import_mb, "extra_mb": max(export_mb, import_mb)}


def run_point(p: dict) -> dict:
    """Builds the point's model (and head), resets the peak, runs the work; the result has base and extra MB."""
    import torch

    from bebop.mtp.head import MtpHead
    from bebop.utils.allocator import return_large_blocks

    return_large_blocks()  # as the CLI does
    if p["kind"] in LONG_KINDS:
        return _long_point(p)
    torch.set_num_threads(p["threads"])
    positions = max(8192, PROMPT_TOKENS + p.get("new_tokens", 0) + 2 * SPECULATE_K)
    model = build_model(p["vocab"], p["layers"], "qwen3_5" if p["kind"] == "export" else "qwen3",
                        tiny=p.get("tiny", False), positions=positions)
    needs_head = p["kind"] in ("train-mtp", "eval-mtp", "export") or p.get("mode") == "rs"
    head = MtpHead(model) if needs_head else None
    for param in model.parameters():
        param.requires_grad_(False)
    _reset_peak()
    base = _status_mb("VmRSS")
    if p["kind"] == "rl":
        out = _rl_point(model, p)
    elif p["kind"] == "export":
        out = _export_point(model, head, p)
    elif p["kind"] == "check-lossless":
        out = _check_lossless_point(model, p)
    else:
        work = {"train-mtp": _train_mtp_point, "eval-mtp": _eval_mtp_point, "generate": _generate_point}[p["kind"]]
        out = work(model, head, p)
    extra = out.pop("extra_mb", out.pop("peak_mb", _status_mb("VmHWM")) - base)
    weights = sum(q.numel() * q.element_size() for q in model.parameters()) / 2**20
    return {**out, "base_mb": base, "extra_mb": extra, "weights_mb": weights}


# ----------------------------------------------------------------------------- the curves


def curves(quick: bool, layers: int) -> list[dict]:
    """Each curve: a name, the point field that grows (``x``), its values (--quick's, or the full run's) and the
    fixed fields; the slopes are taken against ``size`` (tokens per step where tokens grow)."""
    def c(section, name, x, quick_values, full_values, size=None, **fixed):
        return {"section": section, "name": name, "x": x, "values": quick_values if quick else full_values,
                "size": size or (lambda p: p[x]), "fixed": {"vocab": QWEN3_VOCAB, "layers": layers, **fixed}}

    def length_curve(name, kind, lengths=LENGTHS, **fixed):  # one row of a tiny-width model, long completions
        return c("length", f"{name}: completion length (1 row, tiny width, V = {TINY_VOCAB:,})", "new_tokens",
                 LENGTHS_QUICK, lengths, kind=kind, rows=1, tiny=True, vocab=TINY_VOCAB, per_token=True, **fixed)

    def rl_tokens(p):
        return p["rows"] * (PROMPT_TOKENS + p["new_tokens"])

    def chain_tokens(p):
        return p["rows"] * p["length"]

    vocabs = [32_768, QWEN3_VOCAB, QWEN3_5_VOCAB]
    return [
        c("rl", "rl step: completion length (2 rows; memory of logprobs + backward)", "new_tokens", [32, 128],
          [128, 256, 512, 1024], rl_tokens,
          kind="rl", rows=2),
        c("rl", "rl step, full logits: completion length (2 rows; same memory)", "new_tokens", [32, 128], [128, 256, 512],
          rl_tokens, kind="rl", rows=2, full_logits=True),
        c("rl", "rl step: rows (64 new tokens)", "rows", [], [2, 4, 8, 16], rl_tokens, kind="rl", new_tokens=64),
        c("rl", "rl step: vocabulary (2 rows x 64)", "vocab", vocabs[::2], vocabs, kind="rl", rows=2, new_tokens=64),
        c("train-mtp", "train-mtp step: tokens (1 row, K=3)", "length", [64, 256], [128, 256, 512, 1024], chain_tokens,
          kind="train-mtp", rows=1),
        c("train-mtp", "train-mtp step: vocabulary (1 row x 128)", "vocab", [], vocabs, kind="train-mtp", rows=1,
          length=128),
        c("eval-mtp", "eval-mtp: tokens (1 row, K=3)", "length", [64, 128], [128, 256, 512], chain_tokens,
          kind="eval-mtp", rows=1),
        c("mtp-long", "train-mtp step: tokens at tiny width (1 row, K=3, D=64, V=8,192)", "length", [2048, 4096],
          [2048, 4096, 8192, 16384], chain_tokens, kind="train-mtp-long", rows=1, vocab=LONG_VOCAB),
        c("mtp-long", "eval-mtp: tokens at tiny width (1 row, K=3, D=64, V=8,192)", "length", [2048, 4096],
          [2048, 4096, 8192, 16384], chain_tokens, kind="eval-mtp-long", rows=1, vocab=LONG_VOCAB),
        c("mtp-long", "online head step: tokens at tiny width (1 row, K=3, D=64, V=8,192)", "length", [2048, 4096],
          [2048, 4096, 8192, 16384], chain_tokens, kind="online-long", rows=1, vocab=LONG_VOCAB),
        c("generate", "generate rs: rows (32 new tokens)", "rows", [1, 8], [1, 8, 64], kind="generate", mode="rs",
          new_tokens=32),
        c("generate", "generate rs: completion length (8 rows)", "new_tokens", [], [32, 64, 128], kind="generate",
          mode="rs", rows=8),
        c("check-lossless", "check-lossless reference: samples", "samples", [25, 50], [50, 100, 200],
          kind="check-lossless"),
        c("export", "export-mtp + import-mtp: vocabulary (Qwen3.5 blocks)", "vocab", vocabs[::2], vocabs, kind="export"),
        length_curve("rl step", "rl", RL_LENGTHS),
        length_curve("generate rs", "generate", mode="rs"),
        length_curve("generate none", "generate", mode="none"),
    ]


def headline(layers: int) -> dict:
    """The RL step over 8 rows x 512 new tokens (2 layers by default): its peak against weights + AdamW state."""
    return {"kind": "rl", "rows": 8, "new_tokens": 512, "vocab": QWEN3_VOCAB, "layers": layers}


def versus_hf(quick: bool, layers: int) -> list[dict]:
    """Plain decoding and rs (K=3) in Bebop's engine, and HF generate, at B = 1, 8, 64."""
    new = 8 if quick else 32
    return [{"kind": "generate", "mode": mode, "rows": rows, "new_tokens": new, "vocab": QWEN3_VOCAB, "layers": layers}
            for rows in (1, 8, 64) for mode in ("none", "rs", "hf")]


def spawn(point: dict, threads: int) -> dict:
    """Runs one point in a fresh process; {"error": ...} when it fails."""
    point = {**point, "threads": threads}
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(point)], env=env, cwd=REPO,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["exit status %d" % proc.returncode])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log y against log x (nan with fewer than two positive points).

    Example: ``slope([1, 2, 4], [3, 6, 12]) == 1.0``.
    """
    pairs = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y > 0]
    if len(pairs) < 2:
        return float("nan")
    mx, my = (sum(v) / len(pairs) for v in zip(*pairs))
    den = sum((a - mx) ** 2 for a, _ in pairs)
    return sum((a - mx) * (b - my) for a, b in pairs) / den if den else float("nan")


def _notes(row: dict) -> str:
    """What a point measured besides its time and extra memory."""
    if "error" in row:
        return "failed: " + row["error"]
    if "logprobs_mb" in row:
        return (f"phases: old logprobs {row['logprobs_mb']:.0f}, loss+backward {row['backward_mb']:.0f}, "
                f"AdamW step {row['adamw_step_mb']:.0f} MB")
    if "block_s" in row:
        per_token = {key: 1000 * row[key] / row["tokens"] for key in ("seconds", "block_s", "float64_block_s")}
        rest = per_token["seconds"] - per_token["block_s"]
        return (f"per token: block estimate {per_token['block_s']:.2f} ms, the rest {rest:.2f} ms (float64 "
                f"estimator: {per_token['float64_block_s']:.2f} ms)")
    if "tokens" in row:
        accept = row.get("accept_length")
        return f"{row['tokens'] / row['seconds']:.1f} tok/s" + (f", accept length {accept:.2f}" if accept else "")
    if "export_s" in row:
        return f"export {row['export_s']:.1f} s, {row['export_mb']:.0f} MB; import {row['import_mb']:.0f} MB"
    return ""


def _fmt(value: float, spec: str = ".1f") -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def run_curve(curve: dict, threads: int) -> tuple[list[str], dict]:
    """Measures every point of a curve -> (its table lines, its summary row)."""
    lines = [f"### {curve['name']}", "", f"| {curve['x']} | seconds | extra MB | base MB | notes |", "|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    xs, seconds, extras = [], [], []
    for value in curve["values"]:
        point = {**curve["fixed"], curve["x"]: value}
        row = spawn(point, threads)
        ok = "error" not in row
        notes = _notes(row)
        if ok and point.get("per_token"):
            size = curve["size"](point)
            notes = (f"per token: {1e3 * row['seconds'] / size:.2f} ms, {1024 * row['extra_mb'] / size:.1f} KB; "
                     + notes).rstrip("; ")
        lines.append(f"| {value:,} | {_fmt(row.get('seconds'))} | {_fmt(row.get('extra_mb'), '.0f')} | "
                     f"{_fmt(row.get('base_mb'), '.0f')} | {notes} |")
        print(lines[-1], flush=True)
        if ok:
            xs.append(curve["size"](point))
            seconds.append(row["seconds"])
            extras.append(row["extra_mb"])
    grows = "tokens per step" if curve["size"](point) != value else curve["x"]
    summary = {"name": curve["name"], "x": grows, "range": f"{min(xs or [0]):,}-{max(xs or [0]):,}",
               "time_slope": slope(xs, seconds), "memory_slope": slope(xs, extras),
               "extra_mb": extras[-1] if extras else float("nan")}
    lines += ["", f"slopes (log-log, against {grows}): time {_fmt(summary['time_slope'], '.2f')}, "
                  f"extra memory {_fmt(summary['memory_slope'], '.2f')}", ""]
    return lines, summary


def run_versus_hf(points: list[dict], threads: int) -> list[str]:
    """Tok/s of Bebop's plain and rs decoding and of HF generate at each B, with the ratios to HF."""
    lines = ["### decoding against HF generate (T = 1, no top-k/top-p)", "",
             "| B | mode | tok/s | / HF | extra MB | accept length |", "|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    by_rows: dict[int, dict[str, dict]] = {}
    for point in points:
        by_rows.setdefault(point["rows"], {})[point["mode"]] = spawn(point, threads)
    for rows, modes in by_rows.items():
        hf = modes.get("hf", {})
        hf_rate = hf["tokens"] / hf["seconds"] if "tokens" in hf else float("nan")
        for mode, row in modes.items():
            rate = row["tokens"] / row["seconds"] if "tokens" in row else float("nan")
            name = {"none": "Bebop plain", "rs": f"Bebop rs K={SPECULATE_K}", "hf": "HF generate"}[mode]
            lines.append(f"| {rows} | {name} | {_fmt(rate)} | {_fmt(rate / hf_rate, '.2f')} | "
                         f"{_fmt(row.get('extra_mb'), '.0f')} | {_fmt(row.get('accept_length'), '.2f')} |"
                         + (f" failed: {row['error']}" if "error" in row else ""))
            print(lines[-1], flush=True)
    return lines + [""]


def run_headline(point: dict, threads: int) -> list[str]:
    """One large RL step (8 rows x 512 new tokens by default): its peak over the weights + AdamW moments."""
    row = spawn(point, threads)
    if "error" in row:
        return [f"rl step {point['rows']} x {point['new_tokens']}: failed: {row['error']}", ""]
    runtime = row["base_mb"] - row["weights_mb"]  # torch and Python, before any weight
    peak = row["step_peak_mb"]
    ratio = (peak - runtime) / row["state_mb"]
    return [f"### rl step, {point['rows']} rows x {point['new_tokens']} new tokens ({point['layers']} layers, "
            f"V = {point['vocab']:,})", "",
            f"peak {peak:.0f} MB = runtime {runtime:.0f} + {peak - runtime:.0f} MB, which is {ratio:.2f}x the weights + "
            f"AdamW moments ({row['state_mb']:.0f} MB); {row['seconds']:.0f} s; {_notes(row)}", ""]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--quick", action="store_true", help="small sizes, no RL headline (see bench/README.md for times)")
    ap.add_argument("--only", nargs="+", default=None,
                    help="sections: rl train-mtp eval-mtp mtp-long generate check-lossless export length versus-hf "
                         "headline")
    ap.add_argument("--layers", type=int, default=2, help="decoder layers of the model (2: 187 M parameters)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per point")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(run_point(json.loads(args.worker))))
        return
    import torch
    import transformers
    from bebop.utils.progress import stage

    wanted = set(args.only or ["rl", "train-mtp", "eval-mtp", "mtp-long", "generate", "check-lossless", "export",
                               "length", "versus-hf"]
                 + ([] if args.quick or args.only else ["headline"]))
    print(f"# bench/scale.py{' --quick' if args.quick else ''} | torch {torch.__version__} | transformers "
          f"{transformers.__version__} | {args.threads} thread(s) per point | load {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs | Qwen3 blocks, D = 1,024, {args.layers} layers, random weights\n", flush=True)
    start, summaries = time.time(), []
    for curve in curves(args.quick, args.layers):
        if curve["section"] in wanted and curve["values"]:
            with stage(f"bench/scale.py: {curve['name']}"):
                lines, summary = run_curve(curve, args.threads)
            print("\n".join(lines[-2:]), flush=True)
            summaries.append(summary)
    if "headline" in wanted:
        with stage("bench/scale.py: headline"):
            print("\n".join(run_headline(headline(args.layers), args.threads)), flush=True)
    if "versus-hf" in wanted:
        with stage("bench/scale.py: versus-hf"):
            run_versus_hf(versus_hf(args.quick, args.layers), args.threads)
    print("\n| core | grows with | sizes | time slope | extra memory slope | extra MB at the largest |")
    print("|---|---|---|---|---|---|")
    for s in summaries:
        print(f"| {s['name']} | {s['x']} | {s['range']} | {_fmt(s['time_slope'], '.2f')} | "
              f"{_fmt(s['memory_slope'], '.2f')} | {_fmt(s['extra_mb'], '.0f')} |")
    print(f"\n# {time.time() - start:.0f} s in all; load {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
