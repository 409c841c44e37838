"""A tiny hybrid (three Gated DeltaNet layers to one full attention, Qwen3.5's shape) and its MTP head served by
vLLM's CPU build (``make test-vllm``), against Bebop's engine.

Bebop's side runs in the project's main venv (``hybrid_engine_side``: vLLM's transformers pin has no
recurrent-state rollback for the engine); vLLM serves the same files here through the vllm backend, in
bfloat16 with prefix caching off, as its CPU build runs hybrids (``engine_options``). Bebop's engine runs
the float32 policy, so the two are compared as follows:

* greedy (T = 0, rs, K = 3): each vLLM row equals Bebop's plain greedy row, or leaves it first at a
  position where the float32 policy's best two logits are within TIE_MARGIN, where bf16 rounding may
  pick the other one; and at least MIN_EQUAL_ROWS of the rows are equal throughout (measured: 29 of 32;
  the other three leave at their second token, where the float32 gaps are 0.015-0.018).
* sampled (T = 1, rs, K = 3): accept lengths as vLLM counts them (every verify step) within
  ACCEPT_TOLERANCE (measured: vLLM 2.045 and 2.006 in two runs, Bebop 2.029).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from bebop import models  # noqa: E402
from bebop.mtp import MtpHead  # noqa: E402
from bebop.rollout.base import make_backend  # noqa: E402
from bebop.speculative import SamplingParams, SpecConfig  # noqa: E402
from bebop.speculative.attention import has_recurrent_layers  # noqa: E402
from tests.vllm import hybrid_engine_side as side  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ENGINE_PYTHON = os.environ.get("BEBOP_ENGINE_PYTHON", str(ROOT / ".venv" / "bin" / "python"))  # the main venv's
TIE_MARGIN = 0.1  # logits; measured: the rows that leave Bebop's do so at gaps of 0.015-0.018
MIN_EQUAL_ROWS = 0.75  # of the greedy rows
ACCEPT_TOLERANCE = 0.1  # |Bebop - vLLM| accept length at T = 1


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(engine.json's results, the vllm backend, the tokenizer) of the tiny hybrid and its head."""
    out = tmp_path_factory.mktemp("hybrid")
    assert Path(ENGINE_PYTHON).is_file(), f"Bebop's side needs the main venv ({ENGINE_PYTHON}): make install"
    run = subprocess.run([ENGINE_PYTHON, "-m", "tests.vllm.hybrid_engine_side", str(out)], cwd=ROOT,
                         env={**os.environ, "BEBOP_CACHE_DIR": str(out / "cache")}, capture_output=True, text=True,
                         timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    model, tok = models.load_model(out / "model", show_progress=False)
    assert has_recurrent_layers(model.config)
    head = MtpHead.from_pretrained(out / "head", model).eval()
    backend = make_backend("vllm", model, tok, head, workdir=out / "vllm")
    assert backend.options == {"dtype": "bfloat16", "enable_prefix_caching": False}
    yield json.loads((out / "engine.json").read_text()), backend, tok
    backend.close()


def _first_difference(a: list[int], b: list[int]) -> int | None:
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def test_greedy_rows_equal_bebop_up_to_near_ties(served):
    ours, backend, tok = served
    assert ours["rs"] == ours["plain"]  # Bebop's own speculative greedy is plain greedy
    prompts = side.prompts(tok, **side.GREEDY_PROMPTS)
    theirs = backend.rollout(prompts, SamplingParams(temperature=0.0, max_new_tokens=side.MAX_NEW_TOKENS),
                             SpecConfig("rs", side.K))
    assert theirs.stats.verifier_num_accepted_tokens > 0  # MTP drafting really ran
    equal = 0
    for row, (a, b, gaps) in enumerate(zip(theirs.token_ids, ours["plain"], ours["gaps"])):
        i = _first_difference(a, b)
        if i is None:
            equal += 1
            continue
        assert i < len(b) and gaps[i] < TIE_MARGIN, (
            f"row {row} leaves Bebop's greedy at token {i} where the float32 policy's top-two logit gap is "
            f"{gaps[i] if i < len(b) else None}: vLLM {a} / Bebop {b}")
    assert equal >= MIN_EQUAL_ROWS * len(prompts), f"only {equal} of {len(prompts)} greedy rows equal"


def test_accept_length_close_to_bebops_at_t1(served):
    """vLLM's accept length (every verify step, its counting) within ACCEPT_TOLERANCE of Bebop's engine's.

    False-alarm odds: a verify step accepts 0..3 drafts (standard deviation at most 1.5); with at least 3000
    verify steps on each side (checked) the difference of the means has a standard error of at most 0.039,
    and 0.1 is 2.6 of them: under 1% two-sided (normal approximation, steps independent). The bf16 rounding
    of vLLM's policy moves the expected accept length by less than the runs' own spread (module docstring).
    """
    ours, backend, tok = served
    prompts = side.prompts(tok, **side.SAMPLED_PROMPTS)
    theirs = backend.rollout(prompts, SamplingParams(temperature=1.0, max_new_tokens=side.MAX_NEW_TOKENS),
                             SpecConfig("rs", side.K)).stats
    drafts, accepted = ours["sampled_verifier"]
    assert min(drafts, theirs.verifier_num_drafts) >= 3000
    ours_length = 1 + accepted / drafts
    assert abs(theirs.verifier_accept_length - ours_length) <= ACCEPT_TOLERANCE, (theirs.verifier_accept_length,
                                                                                  ours_length)
