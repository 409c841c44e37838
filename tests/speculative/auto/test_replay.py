"""Tests for bebop.speculative.auto.replay: each K's alphas replayed on recorded completions.

What pins it:
  * ``replay`` against every path of steps enumerated by hand (random tables and completions, K = 1..3).
  * the selection it removes: completions whose hard positions come every third token, decoded step by
    step at K = 1 into a real ``EmissionLog``; the alphas ``Acceptance`` gives an unrun K = 2 match
    K = 2's own steps (simulated the same way) with the replay, and miss them without it.
  * the entropies of a real call's kept tokens per completion, the state's round trip, decay and
    the newest-rows cap.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bebop.speculative.auto import replay as rp
from bebop.speculative.auto.chooser import Acceptance, AutoChooser, completion_entropies
from bebop.speculative.engine import Decoder, SamplingParams, SpecConfig
from bebop.speculative.stats import EmissionLog
from bebop.speculative.auto.tail import OFFSET_EDGES
from tests.helpers import ToyTokenizer, peaked_model, perturbed_head, toy_prompts

BUCKETS = len(OFFSET_EDGES) + 1


def _enumerated(table, rows, weights, k):
    """Expected drafts and accepts per (offset bucket, depth), every path of steps walked."""
    drafts, accepts = np.zeros((BUCKETS + 1, k)), np.zeros((BUCKETS + 1, k))

    def walk(row, w, start, mass):
        if start >= len(row):
            return
        b = int(np.searchsorted(OFFSET_EDGES, start, side="right"))
        reach = mass
        for j in range(k):
            if start + j >= len(row):
                return  # the completion ended inside the step
            a = table[j][row[start + j]]
            drafts[b, j] += w * reach
            accepts[b, j] += w * reach * a
            walk(row, w, start + j + 1, reach * (1 - a))  # depth j + 1 rejected: j + 1 tokens
            reach *= a
        walk(row, w, start + k + 1, reach)  # all accepted, and the bonus

    for row, w in zip(rows, weights):
        walk(row, w, rp.FIRST_DECODE, 1.0)
    drafts[-1], accepts[-1] = drafts[:-1].sum(0), accepts[:-1].sum(0)
    return np.divide(accepts, drafts, out=np.zeros_like(drafts), where=drafts > 0), drafts


def test_the_docstring_example():
    alphas, drafts = rp.replay(np.full((1, 10), 0.5), *rp.grid([np.zeros(3, dtype=np.int8)]), np.ones(1), 1)
    assert drafts[0, 0] == pytest.approx(1.5) and alphas[0, 0] == pytest.approx(0.5)
    assert drafts[-1, 0] == pytest.approx(1.5) and drafts[1:-1].sum() == 0


@pytest.mark.parametrize("k", [1, 2, 3])
def test_replay_is_every_path_of_steps_enumerated(k):
    rng = np.random.default_rng(k)
    table = rng.uniform(0.05, 0.95, (k, len(rp.ENTROPY_EDGES) + 1))
    rows = [rng.integers(0, table.shape[1], n).astype(np.int8) for n in (1, 2, 5, 9, 12)]
    weights = rng.uniform(0.2, 1.0, len(rows))
    got, want = rp.replay(table, *rp.grid(rows), weights, k), _enumerated(table, rows, weights, k)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- the selection it removes

EASY, HARD = 0.02, 2.5  # nats: two entropy bins
ALPHA = {EASY: 0.95, HARD: 0.3}  # at every depth


def _completions(rng, rows: int, length: int) -> list[np.ndarray]:
    """Entropy per position: every third token hard, and a hard token now and then besides."""
    out = []
    for _ in range(rows):
        h = np.where(np.arange(length) % 3 == 2, HARD, EASY)
        h[rng.random(length) < 0.05] = HARD
        out.append(h)
    return out


def _decoded(entropies: list[np.ndarray], k: int, rng) -> tuple[EmissionLog, list[int]]:
    """The steps of K over the completions, logged as the engine logs them: a prefill block, then
    verify steps drafting depth j at offset s + j - 1, each accepted with its position's alpha."""
    rows, lengths = len(entropies), [len(h) for h in entropies]
    width = max(lengths) + k + 1
    ent = np.zeros((rows, width))
    alpha = np.zeros((rows, width))
    for r, h in enumerate(entropies):
        ent[r, :len(h)] = h
        alpha[r, :len(h)] = [ALPHA[x] for x in h]
    log = EmissionLog(k)
    log.add_block(list(range(rows)), [0] * rows, [1] * rows, torch.tensor(ent[:, :1]))
    done = [1] * rows
    while active := [r for r in range(rows) if done[r] < lengths[r]]:
        starts, widths = [done[r] for r in active], []
        for r, s in zip(active, starts):
            n = 0
            while n < k and s + n < lengths[r] and rng.random() < alpha[r, s + n]:
                n += 1
            widths.append(n + 1)
            done[r] += n + 1
        window = np.stack([np.arange(s, s + k + 1) for s in starts])
        rows_of = np.array(active)[:, None]
        drafted = (torch.tensor(ent[rows_of, window[:, :k]]), torch.tensor(alpha[rows_of, window[:, :k]]),
                   torch.tensor(alpha[rows_of, window[:, :k]]))
        log.add_block(active, starts, widths, torch.tensor(ent[rows_of, window]), drafted)
    return log, lengths


def test_an_unrun_k_is_priced_where_its_own_steps_would_start():
    rng = np.random.default_rng(0)
    entropies = _completions(rng, 96, 40)
    with_replay, pooled = Acceptance(replay=rp.Replay()), Acceptance()
    log, lengths = _decoded(entropies, 1, rng)
    for acc in (with_replay, pooled):
        acc.observe(log, lengths, greedy=False)
    # K = 2's own steps over the same completions, simulated: what the alphas should be
    own = Acceptance()
    for _ in range(4):
        log2, lengths2 = _decoded(entropies, 2, rng)
        own.observe(log2, lengths2, greedy=False)
    late = BUCKETS - 1
    truth = [own.by_offset[late].sums["rs"][j] / own.by_offset[late].weights[j] for j in range(2)]
    replayed, unaware = with_replay.alphas("rs", 2, late), pooled.alphas("rs", 2, late)
    assert replayed == pytest.approx(truth, abs=0.02)
    assert max(abs(a - t) for a, t in zip(unaware, truth)) > 0.1  # K = 1's depth 1 starts on the hard tokens
    exact, _ = rp.replay(np.array([[ALPHA[EASY]] * 5 + [ALPHA[HARD]] * 5] * 2), *rp.grid(with_replay.replay.rows),
                         np.ones(len(entropies)), 2)  # the true table's replay: the estimate's shrinkage only
    assert replayed == pytest.approx(exact[late], abs=0.01)


# ----------------------------------------------------------------------------- recording


def test_completion_entropies_are_each_rows_kept_tokens_in_order():
    model = peaked_model()
    decoder = Decoder(model, ToyTokenizer(), toy_prompts((3, 5, 8, 2)), mtp=perturbed_head(model, 0.1),
                      sampling=SamplingParams(temperature=1.0, max_new_tokens=16), spec=SpecConfig("rs", 2))
    for _ in range(3):
        decoder.step()
    emitted = [len(t) for t in decoder.runner.outputs]  # mid-call: what each row emitted so far
    partial = completion_entropies(decoder.runner.log.kept(emitted), emitted)
    assert [len(h) for h in partial] == emitted
    while decoder.num_active:
        decoder.step()
    out = decoder.result()
    kept = out.log.kept(out.lengths)
    whole = completion_entropies(kept, out.lengths)
    assert [len(h) for h in whole] == out.lengths
    for r, h in enumerate(whole):
        assert h.tolist() == kept.token_entropy[kept.token_row == r].tolist()  # blocks run in order
        assert kept.token_offset[kept.token_row == r].tolist() == list(range(out.lengths[r]))
        assert h[:emitted[r]].tolist() == partial[r].tolist()


def test_the_model_round_trips_decays_and_keeps_the_newest_rows():
    model = rp.Replay()
    model.add_positions(np.array([1, 1, 2]), np.array([0.0, 2.5, 0.3]),
                        {"rs": np.array([0.9, 0.4, 0.7]), "to": np.array([0.8, 0.3, 0.6])})
    assert model.weights.shape == (2, len(rp.ENTROPY_EDGES) + 1) and model.sums["rs"][0, 8] == pytest.approx(0.4)
    assert model.alphas("rs", 2, 4.0) is None  # no completions yet
    model.add_rows([np.array([0.0, 0.5, 3.5]), np.array([])])
    assert len(model.rows) == 1 and model.rows[0].tolist() == [0, 4, 9]
    back = rp.Replay.from_state(json.loads(json.dumps(model.to_state())))
    assert back.weights.tolist() == model.weights.tolist() and back.sums["to"].tolist() == model.sums["to"].tolist()
    assert [r.tolist() for r in back.rows] == [[0, 4, 9]]
    assert back.alphas("rs", 2, 4.0)[0].tolist() == model.alphas("rs", 2, 4.0)[0].tolist()
    model.decay(0.5)
    assert model.weights.sum() == pytest.approx(1.5) and model.row_weights == [0.5]
    model.add_rows([np.zeros(2)] * rp.REPLAY_ROWS)
    assert len(model.rows) == rp.REPLAY_ROWS and model.row_weights == [1.0] * rp.REPLAY_ROWS
    bad = model.to_state()
    for rows in ([0, len(rp.ENTROPY_EDGES) + 1], [0, 256]):  # NOTE: 256 would wrap to bin 0 as int8
        bad["rows"][0] = rows
        with pytest.raises(ValueError):
            rp.Replay.from_state(bad)


def test_a_profile_saved_before_the_replay_loads_with_a_fresh_one():
    state = AutoChooser().to_state()
    state["acceptance"]["replay"] = None
    assert isinstance(AutoChooser.from_state(state).acceptance.replay, rp.Replay)
    assert AutoChooser(replay=False).acceptance.replay is None
