"""Tests for replay rollback (bebop.speculative.replay, ``RowStates`` in replay mode).

What pins it:
  * on a tiny model of each hybrid family, after a verify pass of 4 positions whose rows keep 1, 2, 3
    and 4, every recurrent layer's state and conv window under replay equal those under snapshots
    (fp32, 1e-6 of their scale): the positions past a row's kept length are identity steps
    (Gated DeltaNet: g = 0, beta = 0; Mamba2: dt = 0);
  * at Qwen3.5's Gated DeltaNet and Nemotron-H's Mamba2 dimensions, what a verify pass holds until its
    commit under replay is at most 1/8 of what it holds under snapshots;
  * auto picks replay exactly when the pass's snapshots would pass SNAPSHOT_BUDGET; a model whose
    recurrent layers have no replay is rolled back by snapshots under auto and refused under replay;
  * rs at T = 1 with one and with two chains per row (multi-draft lanes) samples the same tokens
    under both rollbacks;
  * a recurrent_rollback that is not a choice is refused with the settings' other problems, and
    ``bebop generate --recurrent-rollback`` offers the choices.
The engine-level checks (logits, greedy, batch invariance, lossless) run under both rollbacks in
test_hybrid.py.
"""

from __future__ import annotations

import pytest
import torch

from bebop.speculative import replay, state_cache
from bebop.speculative.settings import SpecConfig, check_settings
from bebop.speculative.target import Target
from bebop.utils.errors import BebopError
from tests.helpers import models
from tests.helpers.models import HYBRIDS, tiny_model
from tests.speculative.test_hybrid import hybrid_model

KEPT = [1, 2, 3, 4]  # rows keep each length of a pass of 4
QWEN35_GATED_DELTA = {"linear_num_value_heads": 32, "linear_num_key_heads": 16, "linear_key_head_dim": 128,
                      "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4}  # Qwen3.5's default config
NEMOTRON_H_MAMBA2 = {"mamba_num_heads": 128, "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8,
                     "conv_kernel": 4, "chunk_size": 128}  # Nemotron-H's default config


def _committed(model, rollback: str, rows: int = len(KEPT), kept=KEPT):
    """Row states after a ragged prefill and one verify pass of 4 whose rows keep ``kept``."""
    target = Target(model, rows, 32, recurrent_rollback=rollback)
    g = torch.Generator().manual_seed(0)
    vocab = model.config.get_text_config().vocab_size
    lengths = sorted(range(3, 3 + rows), reverse=True)
    with torch.no_grad():
        target.prefill(torch.randint(0, vocab, (rows, lengths[0]), generator=g), lengths)
        target.forward(torch.randint(0, vocab, (rows, 4), generator=g))
        held = target.cache.row_states.pending_nbytes()
        target.cache.commit(kept)
    return target.cache.row_states, held


@pytest.mark.parametrize("arch", HYBRIDS)
def test_replay_commits_the_snapshots_states(arch):
    model = hybrid_model(arch, vocab_size=32)
    snap, _ = _committed(model, "snapshot")
    rep, _ = _committed(model, "replay")
    assert snap.states.keys() == rep.states.keys() and snap.windows.keys() == rep.windows.keys()
    for key, state in snap.states.items():
        assert state.abs().max() > 1e-3  # NOTE: a state this small would hide a wrong replay
        torch.testing.assert_close(rep.states[key], state, atol=1e-6 * state.abs().max().item(), rtol=0)
        window = snap.windows[key]  # a later layer's inputs differ in rounding: the pass runs the chunked form
        torch.testing.assert_close(rep.windows[key], window, atol=1e-6 * window.abs().max().item(), rtol=0)


@pytest.mark.parametrize(("arch", "dims"), [("qwen3_5_hybrid", QWEN35_GATED_DELTA), ("nemotron_h", NEMOTRON_H_MAMBA2)])
def test_replay_holds_an_eighth_of_the_snapshots_at_real_dimensions(arch, dims, monkeypatch):
    """One recurrent layer and one attention layer of width 64, the recurrent layer at its family's real size."""
    monkeypatch.setitem(models.EXTRA_KWARGS, arch, {**models.EXTRA_KWARGS[arch], **dims})
    model = tiny_model(arch, vocab_size=16, hidden_size=64, layer_types=["linear_attention", "full_attention"])
    _, snapshots = _committed(model, "snapshot", rows=2, kept=[1, 4])
    _, replayed = _committed(model, "replay", rows=2, kept=[1, 4])
    assert replayed * 8 <= snapshots


def test_auto_replays_when_the_snapshots_pass_the_budget(monkeypatch):
    states = state_cache.RowStates(4, torch.device("cpu"), rollback="auto")
    states.begin(1, 4, record=False)
    states.update_recurrent_state(torch.zeros(4, 256), 0)  # 1 KiB per row
    monkeypatch.setattr(state_cache, "SNAPSHOT_BUDGET", 4 * 4 * 1024)  # a pass of 4 positions over 4 rows: 16 KiB
    assert states.choose_rollback(4, 4) == "snapshot" and states.choose_rollback(4, 3) == "snapshot"
    assert states.choose_rollback(5, 4) == "replay"
    states.begin(5, 4, record=True)
    assert states.replaying and states.get_recurrent_states_to_keep(0) == 0


def test_layers_without_a_replay_roll_back_by_snapshots(monkeypatch):
    monkeypatch.setattr(replay, "REPLAYS", {})
    model = tiny_model("qwen3_5_hybrid")
    assert Target(model, 1, 8, recurrent_rollback="auto").cache.row_states.rollback == "snapshot"
    with pytest.raises(BebopError, match="cannot replay the recurrent layers of qwen3_5_text"):
        Target(model, 1, 8, recurrent_rollback="replay")


def test_an_unknown_rollback_is_refused():
    with pytest.raises(BebopError, match="recurrent_rollback 'replays' is not one of auto, snapshot, replay"):
        check_settings(SpecConfig("rs", 3, recurrent_rollback="replays"), None)



def test_generate_offers_the_setting(capsys):
    from bebop.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--recurrent-rollback", "replays", "--out", "unused.jsonl"])
    assert exit_info.value.code == 2 and "choose from 'auto', 'snapshot', 'replay'" in capsys.readouterr().err


@pytest.mark.parametrize("arch", ["qwen3_5_hybrid", "nemotron_h"])
def test_sampled_rows_are_the_same_under_both_rollbacks(arch):
    """rs at T = 1, one chain and two chains per row (each chain on its own copy of the row's states): the same
    seeds give the same tokens under snapshots and replay (their states differ only in rounding)."""
    from bebop.speculative.engine import SamplingParams, generate
    from tests.helpers.engine import ToyTokenizer, perturbed_head, toy_prompts

    model = hybrid_model(arch, vocab_size=32)
    head, prompts = perturbed_head(model, 0.3), toy_prompts((5, 12, 2, 7), vocab=32)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=16)
    for num_drafts in (1, 2):
        out = {rollback: generate(model, ToyTokenizer(), prompts, mtp=head, sampling=sampling,
                                  spec=SpecConfig("rs", 3, num_drafts=num_drafts, recurrent_rollback=rollback))
               for rollback in ("snapshot", "replay")}
        assert out["snapshot"].token_ids == out["replay"].token_ids
        assert 0 < out["replay"].stats.num_accepted_tokens < out["replay"].stats.num_draft_tokens
