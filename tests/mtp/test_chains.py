"""Served chains (``bebop.mtp.chains``): the engine's draft logits exactly, and its acceptance in law."""

from __future__ import annotations

import json
import math

import pytest
import torch

from bebop.losses import acceptance_stats
from bebop.mtp.chains import unroll_served
from bebop.mtp.data import Sequences, chain_tensors
from bebop.mtp.evaluate import evaluate_mtp
from bebop.mtp.head import MtpHead
from bebop.mtp.train import TrainMtpConfig, saved_config, train_mtp
from bebop.speculative.drafter import Drafter
from bebop.speculative.engine import SamplingParams, SpecConfig, generate
from bebop.utils.errors import BebopError
from tests.helpers.engine import MTP_ATOL, VOCAB, ToyTokenizer, peaked_model, perturbed_head, toy_prompts
from tests.helpers.models import SLIDING_WINDOW_KWARGS, tiny_model

K = 3
Z_MAX = 4.42  # two-sided normal tail 1e-5 per depth: false-alarm odds <= 3e-5 for the K = 3 depths together


def _spy_drafts(monkeypatch) -> list[tuple[int, int, torch.Tensor, torch.Tensor]]:
    """Records, per verify step and row: (row, tokens it had emitted, drafts (K,), draft logits (K, V));
    ``_committed`` turns the count into the committed sequence once the completions are known."""
    records = []
    draft = Drafter.draft

    def spy(self, rows, k, sampled):
        seen: list[torch.Tensor] = []
        real_logits = self.head.logits

        def record(hidden, step=0):
            logits = real_logits(hidden, step=step)
            seen.append(logits.clone())
            return logits

        self.head.logits = record
        try:
            tokens, q = draft(self, rows, k, sampled)
        finally:
            del self.head.logits
        logits = torch.stack(seen, 1)  # (R, K, V)
        for i, (r, n) in enumerate(zip(rows.index, rows.counters.tolist())):
            records.append((r, n, tokens[i], logits[i]))
        return tokens, q

    monkeypatch.setattr(Drafter, "draft", spy)
    return records


def _committed(records, prompts, completions) -> list[tuple[int, list[int], torch.Tensor, torch.Tensor]]:
    """(row, committed sequence, drafts, logits): a row that had emitted n tokens had committed its prompt
    and the first n tokens of its final completion (completions only grow while a row decodes)."""
    return [(r, prompts[r] + completions[r][:n], tokens, logits) for r, n, tokens, logits in records]


def _peaked(arch: str):
    """``peaked_model`` of another architecture (std-1 embeddings, std-0.3 lm_head: rejections happen)."""
    if arch == "qwen3":
        return peaked_model()
    model = tiny_model(arch, vocab_size=VOCAB, sliding_window=4 if arch in SLIDING_WINDOW_KWARGS else None)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for module, std in ((model.get_input_embeddings(), 1.0), (model.get_output_embeddings(), 0.3)):
            module.weight.copy_(std * torch.randn(module.weight.shape, generator=g))
    return model


@pytest.mark.parametrize(("arch", "mode"), [("qwen3", "to"), ("qwen3", "rs"), ("qwen3_5", "rs"),
                                            ("deepseek_v3", "rs"), ("gemma3", "to")])
def test_served_logits_equal_engine_drafts(arch, mode, monkeypatch):
    """Every depth's draft logits of every verify step equal ``unroll_served`` on the committed sequence
    followed by the chain's drafts; ``head.unroll`` (the unrolled context) does not at depth >= 2."""
    model = _peaked(arch)
    head = perturbed_head(model, 0.1)
    prompts = toy_prompts((2, 5, 9))
    records = _spy_drafts(monkeypatch)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=10)
    out = generate(model, ToyTokenizer(), prompts, mtp=head, sampling=sampling, spec=SpecConfig(mode, K), seed=0)
    records = _committed(records, prompts, out.token_ids)
    assert len(records) > 2 * len(prompts)
    unrolled_gap = 0.0
    for _, committed, drafts, logits in records:
        t = len(committed) - 2  # the frontier pair is (h_t, last committed token)
        ids = torch.tensor([committed + drafts[: K - 1].tolist()])
        with torch.no_grad():
            hidden = model.get_decoder()(input_ids=ids).last_hidden_state
            served = torch.stack([d[0, t] for d in unroll_served(head, hidden, ids, K)])  # (K, V)
            unrolled = torch.stack([d[0, t] for d in head.unroll(hidden, ids, K)])
        torch.testing.assert_close(served, logits, atol=MTP_ATOL, rtol=0)
        unrolled_gap = max(unrolled_gap, float((unrolled[1:] - logits[1:]).abs().max()))
    assert unrolled_gap > 100 * MTP_ATOL  # the old path is measurably not what the engine drafts from


def test_served_alpha_matches_engine_acceptance(monkeypatch):
    """At each depth j, the engine's accepted drafts (RS, T = 1) among the verify steps that reached j
    match the sum of the served alpha_RS,j at those steps' chain starts (what eval-mtp averages).

    Given its context, the depth-j accept is a Bernoulli(alpha_j) coin, so the sum over reached steps
    minus the sum of alphas, over sqrt(sum alpha (1 - alpha)), is asymptotically N(0, 1) (a martingale
    CLT); |z| < Z_MAX has false-alarm odds <= 3e-5 for the three depths. Steps are kept by their chain
    start only (all K steps inside the final sequence), which the coins cannot influence.
    """
    model = peaked_model()
    head = perturbed_head(model, 0.3)
    prompts = toy_prompts(tuple([3] * 160), seed=2)
    max_new = 24
    records = _spy_drafts(monkeypatch)
    out = generate(model, ToyTokenizer(), prompts, mtp=head, sampling=SamplingParams(1.0, max_new_tokens=max_new),
                   spec=SpecConfig("rs", K), seed=3)
    records = _committed(records, prompts, out.token_ids)
    seqs = [p + c for p, c in zip(prompts, out.token_ids)]
    assert all(len(c) == max_new for c in out.token_ids)  # no EOS: every row runs to its length
    data = Sequences(seqs, [len(p) for p in prompts])
    ids, lengths, starts = data.batch(list(range(len(seqs))), 0, torch.device("cpu"))
    with torch.no_grad():
        draft, target, mask = chain_tensors(model, head, ids, lengths, starts, K, chain_context="served")
        alpha, _, _ = acceptance_stats(draft, target, temperature=1.0)  # (N, K) one row per chain start
    t_first = (starts - 1).clamp_min(0)
    row_offset = torch.cumsum(lengths - 2 - t_first, 0) - (lengths - 2 - t_first)  # chains per row before it
    accepted_sum, alpha_sum, var_sum, num = [0.0] * K, [0.0] * K, [0.0] * K, [0] * K
    for row, committed, drafts, _ in records:
        t = len(committed) - 2
        if t + K + 1 >= len(seqs[row]):
            continue
        assert seqs[row][t + 1] == committed[-1]
        num_accepted = 0
        while num_accepted < K and seqs[row][t + 2 + num_accepted] == int(drafts[num_accepted]):
            num_accepted += 1
        a = alpha[int(row_offset[row]) + t - int(t_first[row])]
        for j in range(min(num_accepted + 1, K)):  # depth j + 1 was reached
            accepted_sum[j] += float(j < num_accepted)
            alpha_sum[j] += float(a[j])
            var_sum[j] += float(a[j] * (1 - a[j]))
            num[j] += 1
    for j in range(K):
        assert num[j] > 150, num
        z = (accepted_sum[j] - alpha_sum[j]) / math.sqrt(var_sum[j])
        assert abs(z) < Z_MAX, f"depth {j + 1}: {accepted_sum[j]} accepted, {alpha_sum[j]:.1f} expected, z = {z:.2f}"
    served = evaluate_mtp(model, head, data, speculate_k=K, chain_context="served")
    assert served["alpha_rs"] == pytest.approx((alpha * mask).sum(0) / mask.sum(0), abs=1e-6)


def test_served_depth1_equals_unrolled_and_needs_one_layer():
    model = peaked_model()
    head = perturbed_head(model, 0.1)
    ids = torch.tensor(toy_prompts((7, 7), seed=1))
    with torch.no_grad():
        hidden = model.get_decoder()(input_ids=ids).last_hidden_state
        torch.testing.assert_close(unroll_served(head, hidden, ids, 2)[0], head.unroll(hidden, ids, 1)[0])
        with pytest.raises(BebopError, match="one MTP layer"):
            unroll_served(MtpHead(model, num_layers=2), hidden, ids, 2)


def test_train_and_eval_take_the_chain_context(tmp_path):
    """train-mtp with ``served`` optimises the served chains (its logged alpha is theirs) and records the
    context; an unknown context is one BebopError line before anything is written."""
    model = peaked_model()
    seqs = toy_prompts(tuple([12] * 8), seed=4)
    data = Sequences(seqs, [3] * len(seqs))
    cfg = TrainMtpConfig(loss="e2e_tv", steps=2, batch_size=8, speculate_k=3, save_every=0, lr=1e-2)  # served
    head = train_mtp(model, data, tmp_path / "served", cfg, show_progress=False)
    saved = json.loads((tmp_path / "served" / "mtp_config.json").read_text())
    assert saved["train"]["chain_context"] == "served"
    results = {c: evaluate_mtp(model, head, data, speculate_k=3, chain_context=c) for c in ("unrolled", "served")}
    assert results["served"]["alpha_rs"][0] == pytest.approx(results["unrolled"]["alpha_rs"][0], abs=1e-6)
    assert results["served"]["alpha_rs"][1:] != pytest.approx(results["unrolled"]["alpha_rs"][1:], abs=1e-6)
    with pytest.raises(BebopError, match="unknown chain context 'engine'"):
        train_mtp(model, data, tmp_path / "bad", TrainMtpConfig(chain_context="engine"), show_progress=False)
    assert not (tmp_path / "bad").exists()
    with pytest.raises(BebopError, match="unknown chain context"):
        evaluate_mtp(model, head, data, speculate_k=3, chain_context="engine")
    # The default (served) refuses a two-layer head in one line, before the output directory is made.
    with pytest.raises(BebopError, match="one MTP layer.*--chain-context unrolled"):
        train_mtp(model, data, tmp_path / "two", TrainMtpConfig(num_layers=2, steps=1), show_progress=False)
    assert not (tmp_path / "two").exists()
    two = train_mtp(model, data, tmp_path / "two", TrainMtpConfig(num_layers=2, steps=1, batch_size=2, save_every=0,
                                                                   chain_context="unrolled"), show_progress=False)
    assert len(two.layers) == 2


def test_checkpoint_without_chain_context_resumes_unrolled(tmp_path):
    """A checkpoint written before ``chain_context`` existed was trained unrolled: the CLI's resume keeps
    that (``saved_config``), and resuming it with the new default (served) is refused in one line."""
    model = peaked_model()
    data = Sequences(toy_prompts(tuple([12] * 4), seed=4), [3] * 4)
    cfg = TrainMtpConfig(steps=1, batch_size=2, save_every=0, chain_context="unrolled")
    train_mtp(model, data, tmp_path, cfg, show_progress=False)
    config_file = tmp_path / "checkpoint" / "config.json"
    old = json.loads(config_file.read_text())
    del old["chain_context"]
    config_file.write_text(json.dumps(old))
    assert saved_config(tmp_path)["chain_context"] == "unrolled"
    with pytest.raises(BebopError, match="chain_context 'unrolled' -> 'served'"):
        train_mtp(model, data, tmp_path, TrainMtpConfig(steps=2, batch_size=2, save_every=0), resume=True,
                  show_progress=False)
    train_mtp(model, data, tmp_path, TrainMtpConfig(**{**saved_config(tmp_path), "steps": 2}), resume=True,
              show_progress=False)
