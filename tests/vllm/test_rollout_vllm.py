"""The rollout interface on vLLM (``make test-vllm``): contract, T = 0 equality with Bebop's engine,
weight sync without restart, check-lossless's verdict on the CPU defect, and a 5-step ``bebop rl``.

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
from tests.rollout import contract  # noqa: E402

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
    """(vLLM backend, engine backend) on the same policy and head; the fix on (T > 0 rows are sampled)."""
    os.environ[vllm_cpu_fix.ENV_FLAG] = "1"
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
    ours = generate(new_model, tok, prompts, mtp=new_head, sampling=greedy, spec=SpecConfig("rs", K)).verifier_stats()
    stale = vb.rollout(prompts, greedy, SpecConfig("rs", K)).stats
    vb.sync(new_model, new_head)
    synced = vb.rollout(prompts, greedy, SpecConfig("rs", K)).stats
    assert (synced.num_drafts, synced.accepted_per_pos) == (ours.num_drafts, ours.accepted_per_pos)
    assert (stale.num_drafts, stale.accepted_per_pos) != (ours.num_drafts, ours.accepted_per_pos)
    vb.sync(model, head)  # back to the served weights for the tests after this one


def _bebop(*args, env_extra: dict, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, **env_extra, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), str(ROOT / "tests/vllm/stubs"), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "bebop.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


@pytest.mark.parametrize("fix", ["0", "1"])
def test_check_lossless_catches_the_cpu_defect_and_passes_with_the_fix(backends, fix):
    """Without the fix vllm-cpu 0.32.0 samples wrong tokens at T > 0: the check must fail and name configurations;
    with it, pass. False alarm odds with the fix: at most 1 - (1 - 3e-4)^m over m <= 118 informative checks, 3.5%."""
    backends[0].close()  # one engine per process: the subprocess's own
    out = _bebop("check-lossless", "--backend", "vllm", "--samples", "1500", "--threads", "1",
                 env_extra={vllm_cpu_fix.ENV_FLAG: fix})
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
        out = _bebop("rl", "--backend", backend, "--out", str(tmp_path / backend), *flags,
                     env_extra={vllm_cpu_fix.ENV_FLAG: "1"})
        assert out.returncode == 0, out.stderr[-3000:]
    rows = {b: [json.loads(line) for line in (tmp_path / b / "metrics.jsonl").read_text().splitlines()]
            for b in ("engine", "vllm")}
    assert len(rows["vllm"]) == len(rows["engine"]) == 5
    assert [list(r) for r in rows["vllm"]] == [list(r) for r in rows["engine"]]
    assert all(r["spec/accept_length"] > 1 and r["spec/alpha_rs"] is None for r in rows["vllm"])
