"""Bebop's side of the tiny hybrid's vLLM round trip (``test_vllm_hybrid.py``), run in the project's main venv.

vLLM's CPU build pins transformers < 5.20, whose recurrent layers do not hand over the per-position
states that Bebop's engine rolls a verify pass back with (the engine refuses hybrids there). So this
script, in the main venv, builds the tiny hybrid and its head and runs Bebop's engine; the test, in the
vLLM venv, serves the same files with vLLM and compares.

Usage: python -m tests.vllm.hybrid_engine_side OUT  -> OUT/model, OUT/head, OUT/engine.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from bebop import embedded, models
from bebop.mtp import MtpHead
from bebop.mtp.train import TrainMtpConfig, train_mtp
from bebop.speculative import SamplingParams, SpecConfig, generate
from bebop.task import arith

# three Gated DeltaNet layers and one full-attention layer (Qwen3.5's 3:1), the embedded task, briefly trained:
# peaked enough that greedy rows are mostly clear choices and the head's acceptance is far from 0 and from K
PRETRAIN = embedded.PretrainConfig(steps=150, num_layers=4, full_attention_interval=4, eval_problems=16)
HEAD_STEPS = 40  # CE steps of the MTP head
HEAD_SEQUENCES = 256  # self-generated sequences it trains on
K = 3
MAX_NEW_TOKENS = 48
GREEDY_PROMPTS = {"num": 32, "seed": 7}
SAMPLED_PROMPTS = {"num": 512, "seed": 11}


def prompts(tok, num: int, seed: int) -> list[list[int]]:
    return [tok.encode(p.prompt) for p in arith.make_problems(num, seed=seed)]


def top_two_gaps(model, prompt: list[int], completion: list[int]) -> list[float]:
    """The float32 policy's best minus second-best logit before each completion token: how far each greedy
    choice is from a tie that rounding could flip."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1: -1]  # (T, V)
    top = logits.topk(2, dim=-1).values
    return (top[:, 0] - top[:, 1]).tolist()


def main(out: Path) -> None:
    torch.set_num_threads(1)
    embedded.pretrain(out / "model", PRETRAIN, show_progress=False)
    model, tok = models.load_model(out / "model", show_progress=False)
    data = embedded.self_generated(model, tok, HEAD_SEQUENCES, seed=1)
    train_mtp(model, data, out / "head", TrainMtpConfig(loss="ce", steps=HEAD_STEPS), pad_id=tok.pad_token_id,
              show_progress=False)
    head = MtpHead.from_pretrained(out / "head", model).eval()
    greedy = SamplingParams(temperature=0.0, max_new_tokens=MAX_NEW_TOKENS)
    greedy_prompts = prompts(tok, **GREEDY_PROMPTS)
    plain = generate(model, tok, greedy_prompts, sampling=greedy).token_ids
    rs = generate(model, tok, greedy_prompts, mtp=head, sampling=greedy, spec=SpecConfig("rs", K))
    sampled = generate(model, tok, prompts(tok, **SAMPLED_PROMPTS), mtp=head, seed=1,
                       sampling=SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW_TOKENS),
                       spec=SpecConfig("rs", K)).stats
    result = {
        "plain": plain, "rs": rs.token_ids,
        "gaps": [top_two_gaps(model, p, c) for p, c in zip(greedy_prompts, plain)],
        "greedy_verifier": [rs.stats.verifier_num_drafts, rs.stats.verifier_num_accepted_tokens],
        "sampled_verifier": [sampled.verifier_num_drafts, sampled.verifier_num_accepted_tokens],
    }
    (out / "engine.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
