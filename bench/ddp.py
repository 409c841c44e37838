"""Data-parallel train-mtp: 2 processes (torchrun) beside 1, time per step and tokens/s.

    PYTHONPATH=. .venv/bin/python bench/ddp.py                 # ~3 min on 2 busy CPU cores
    PYTHONPATH=. .venv/bin/python bench/ddp.py --steps 30 --repeats 3

Each run is ``python -m torch.distributed.run --nproc-per-node N -m bebop train-mtp`` on the same
random Qwen3 backbone (saved once to a temporary directory, nothing downloaded or pretrained) and
the same fixed-length token sequences, with the same global batch, so every run trains the same
head. Configurations alternate within each repeat: 1 process x 1 thread, 1 process x 2 threads,
2 processes x 1 thread. Time per step is the median gap between consecutive steps'
``seconds`` in metrics.jsonl (the first step, with its warm-up, is dropped); tokens/s counts the
global batch's tokens (batch x sequence length) per step. On a machine with C cores, W processes
x T threads compete for the same C cores: 2 processes can only help where one process leaves
cores idle.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import transformers

from bebop.utils.progress import stage

CONFIGS = [(1, 1), (1, 2), (2, 1)]  # (processes, threads per process)


def _model(path: Path, hidden: int, layers: int, vocab: int) -> None:
    torch.manual_seed(0)
    config = transformers.Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden,
                                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                      head_dim=hidden // 4, max_position_embeddings=1024, pad_token_id=0,
                                      eos_token_id=2, bos_token_id=1)
    transformers.Qwen3ForCausalLM(config).save_pretrained(path)
    from bebop.embedded import build_tokenizer  # NOTE: --data holds token ids; the tokenizer is only loaded

    build_tokenizer().save_pretrained(path)


def _data(path: Path, num: int, length: int, vocab: int) -> None:
    g = torch.Generator().manual_seed(0)
    with open(path, "w") as f:
        for _ in range(num):
            ids = torch.randint(4, vocab, (length,), generator=g).tolist()
            f.write(json.dumps({"token_ids": ids, "start": 1}) + "\n")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(work: Path, procs: int, threads: int, args, tag: str) -> float:
    """Seconds per step (median, first step dropped) of one train-mtp run."""
    out = work / tag
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(procs), "--master-port",
           str(_free_port()), "-m", "bebop", "train-mtp", "--model", str(work / "model"), "--data",
           str(work / "data.jsonl"), "--out", str(out), "--steps", str(args.steps), "--batch-size",
           str(args.batch_size), "--speculate-k", str(args.speculate_k), "--loss", "e2e_tv", "--ce-warmup", "0",
           "--device", "cpu", "--threads", str(threads)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seconds = [json.loads(line)["seconds"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(b - a for a, b in zip(seconds, seconds[1:]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--steps", type=int, default=8, help="optimizer steps per run (default 8)")
    p.add_argument("--repeats", type=int, default=2, help="rounds of the three configurations (default 2)")
    p.add_argument("--batch-size", type=int, default=16, help="global batch in sequences (default 16)")
    p.add_argument("--seq-len", type=int, default=64, help="tokens per sequence (default 64)")
    p.add_argument("--hidden", type=int, default=128, help="backbone hidden size (default 128)")
    p.add_argument("--layers", type=int, default=2, help="backbone layers (default 2)")
    p.add_argument("--vocab", type=int, default=2048, help="vocabulary size (default 2048)")
    p.add_argument("--speculate-k", type=int, default=3, help="K_train (default 3)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        _model(work / "model", args.hidden, args.layers, args.vocab)
        _data(work / "data.jsonl", 4 * args.batch_size, args.seq_len, args.vocab)
        times: dict[tuple[int, int], list[float]] = {c: [] for c in CONFIGS}
        for r in range(args.repeats):
            for procs, threads in CONFIGS:
                with stage(f"bench/ddp.py: repeat {r + 1}, {procs} process(es) x {threads} thread(s)"):
                    times[(procs, threads)].append(_run(work, procs, threads, args, f"r{r}-{procs}x{threads}"))
    tokens = args.batch_size * args.seq_len
    print(f"train-mtp e2e_tv K={args.speculate_k}, Qwen3 hidden {args.hidden} x {args.layers} layers, V={args.vocab}, "
          f"global batch {args.batch_size} x {args.seq_len} tokens, {args.steps} steps x {args.repeats} repeats, "
          f"{os.cpu_count()} CPUs, torch {torch.__version__}\n")
    print("| processes x threads | s/step (median of runs) | tokens/s | vs 1 x 1 |")
    print("|---|---|---|---|")
    base = statistics.median(times[(1, 1)])
    for (procs, threads), values in times.items():
        step = statistics.median(values)
        print(f"| {procs} x {threads} | {step:.3f} ({', '.join(f'{v:.3f}' for v in values)}) | {tokens / step:,.0f} | "
              f"{base / step:.2f}x |")
    two, one2 = statistics.median(times[(2, 1)]), statistics.median(times[(1, 2)])
    print(f"\n2 processes / 1 process: step time {two / base:.2f} (1 thread each), {two / one2:.2f} "
          f"(against 1 process x 2 threads)")


if __name__ == "__main__":
    main()
