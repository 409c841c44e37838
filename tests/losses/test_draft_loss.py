"""Draft objectives: chunked analytic versions against a plain float64 autograd reference."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bebop.config import DRAFT_LOSS_NAMES
from bebop.losses import DRAFT_LOSSES, acceptance_stats, draft_loss

NAMES = list(DRAFT_LOSSES)
N, K, V = 5, 4, 23
SMALL_CHUNKS = {"row_chunk": 3, "vocab_chunk": 7}  # 20 rows -> 7 row tiles; 23 -> 4 vocab tiles
ROW_TILES = {"row_chunk": 3}  # whole-row tiles: the log_softmax path without a normaliser pass


# ---------------------------------------------------------------------------------------------
# Plain reference: full softmax, float64, ordinary autograd, explicit loops for the chain.
# ---------------------------------------------------------------------------------------------


def reference_loss(name, draft_logits, target_logits, mask, temperature):
    """Textbook definition of every objective; differentiable through draft_logits."""
    log_q = torch.log_softmax(draft_logits.double() / temperature, dim=-1)
    log_p = torch.log_softmax(target_logits.detach().double() / temperature, dim=-1)
    q, p = log_q.exp(), log_p.exp()
    if name == "e2e_tv":
        alpha = torch.minimum(p, q).sum(-1)
        chain_losses = []
        for n in range(alpha.shape[0]):
            num_steps = 0
            while num_steps < alpha.shape[1] and mask[n, num_steps]:
                num_steps += 1
            if num_steps == 0:
                continue
            prod, total = 1.0, 0.0
            for j in range(num_steps):
                prod = prod * alpha[n, j]
                total = total + prod
            chain_losses.append(1.0 - total / num_steps)
        return torch.stack(chain_losses).mean() if chain_losses else (q.sum() * 0.0)
    per_entry = {
        "ce": lambda: -(p * log_q).sum(-1),
        "fkl": lambda: (p * (log_p - log_q)).sum(-1),
        "rkl": lambda: (q * (log_q - log_p)).sum(-1),
        "tv": lambda: 1.0 - torch.minimum(p, q).sum(-1),
    }[name]()
    if not mask.any():
        return per_entry.sum() * 0.0
    return per_entry[mask].mean()


def value_and_grad(fn, draft_logits):
    """(loss value, d loss / d draft_logits) for fn(leaf)."""
    leaf = draft_logits.detach().clone().requires_grad_(True)
    loss = fn(leaf)
    loss.backward()
    return loss.detach(), leaf.grad


def make_mask(kind, generator):
    """(N, K) bool masks covering the cases the contract names."""
    if kind == "none":
        return None
    mask = torch.rand(N, K, generator=generator) > 0.3
    if kind == "cut":
        mask[1] = False  # a row with nothing valid
        mask[2, 0] = False  # first step cut: K_n = 0 for e2e_tv though later steps are True
        mask[2, 1:] = True
        mask[3] = torch.tensor([True, True, False, True])  # True after the first False
    return mask


@pytest.mark.parametrize("chunks", [SMALL_CHUNKS, ROW_TILES], ids=["vocab_tiles", "row_tiles"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("mask_kind", ["none", "random", "cut"])
@pytest.mark.parametrize("name", NAMES)
def test_matches_reference(name, mask_kind, temperature, chunks):
    seed = 100 * NAMES.index(name) + 10 * len(mask_kind) + int(10 * temperature)
    gen = torch.Generator().manual_seed(seed)
    draft = torch.randn(N, K, V, generator=gen) * 2.0
    target = torch.randn(N, K, V, generator=gen) * 2.0
    mask = make_mask(mask_kind, gen)
    full_mask = torch.ones(N, K, dtype=torch.bool) if mask is None else mask
    got, got_grad = value_and_grad(
        lambda z: draft_loss(name, z, target, mask, temperature, **chunks), draft
    )
    want, want_grad = value_and_grad(
        lambda z: reference_loss(name, z, target, full_mask, temperature), draft
    )
    assert got.dtype == torch.float32 and got.shape == ()
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_grad, want_grad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_chunking_does_not_change_result(name):
    gen = torch.Generator().manual_seed(1)
    draft, target = torch.randn(2, N, K, V, generator=gen).unbind(0)
    one_tile, one_tile_grad = value_and_grad(lambda z: draft_loss(name, z, target), draft)
    tiled, tiled_grad = value_and_grad(
        lambda z: draft_loss(name, z, target, row_chunk=1, vocab_chunk=5), draft
    )
    torch.testing.assert_close(tiled, one_tile, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(tiled_grad, one_tile_grad, atol=1e-7, rtol=1e-6)


def test_the_torch_free_names_are_the_registrys_keys():
    """``bebop.config.DRAFT_LOSS_NAMES`` (the CLI's help, the demo's heads) lists ``DRAFT_LOSSES``, in order."""
    assert DRAFT_LOSS_NAMES == tuple(DRAFT_LOSSES)


def test_e2e_tv_zero_acceptance_step():
    # Row 0, step 2 (index 1): q = one-hot(0), p = one-hot(1) (exp(-1e4) underflows), alpha = 0.
    gen = torch.Generator().manual_seed(2)
    draft = torch.randn(2, 4, 6, generator=gen)
    target = torch.randn(2, 4, 6, generator=gen)
    draft[0, 1] = torch.tensor([0.0, -1e4, -1e4, -1e4, -1e4, -1e4])
    target[0, 1] = torch.tensor([-1e4, 0.0, -1e4, -1e4, -1e4, -1e4])
    mask = torch.ones(2, 4, dtype=torch.bool)
    alpha_rs, _, _ = acceptance_stats(draft, target)
    assert alpha_rs[0, 1] == 0.0
    got, got_grad = value_and_grad(
        lambda z: draft_loss("e2e_tv", z, target, mask, row_chunk=3, vocab_chunk=4), draft
    )
    want, want_grad = value_and_grad(
        lambda z: reference_loss("e2e_tv", z, target, mask, 1.0), draft
    )
    assert torch.isfinite(got) and torch.isfinite(got_grad).all()
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_grad, want_grad, atol=1e-5, rtol=1e-5)
    # Row 0's chain is dead after step 2: its terms vanish, so its later steps get no gradient...
    assert (got_grad[0, 2:] == 0).all()
    # ... while row 0's own loss is exactly 1 - (alpha_1 + 0 + 0 + 0) / 4.
    row0 = draft_loss("e2e_tv", draft[:1], target[:1])
    torch.testing.assert_close(row0, 1 - alpha_rs[0, 0] / 4)
    assert got_grad[0, 0].abs().sum() > 0


# ---------------------------------------------------------------------------------------------
# A case computed by hand: p = [0.5, 0.3, 0.2], q = [0.2, 0.2, 0.6] at step 1 and
# p = [0.1, 0.1, 0.8], q = [0.25, 0.25, 0.5] at step 2 (logits = log probabilities).
#   step 1: alpha_1 = 0.2 + 0.2 + 0.2 = 0.6, S_1 = 0.2 + 0.2 = 0.4 (q <= p at tokens 0, 1)
#           d TV / dz = q (S - 1 + 1[q > p]) = [0.2 * -0.6, 0.2 * -0.6, 0.6 * 0.4]
#   step 2: alpha_2 = 0.1 + 0.1 + 0.5 = 0.7, S_2 = 0.5 (q <= p at token 2 only)
#           d alpha_2 / dz = -q (S - 1 + 1[q > p]) = [-0.125, -0.125, 0.25]
#   e2e_tv = 1 - (0.6 + 0.6 * 0.7) / 2 = 0.49
#           d L / d alpha_1 = -(1 + alpha_2) / 2 = -0.85, d L / d alpha_2 = -alpha_1 / 2 = -0.3
# ---------------------------------------------------------------------------------------------

HAND_P = [[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]]
HAND_Q = [[0.2, 0.2, 0.6], [0.25, 0.25, 0.5]]


def hand_logits():
    """(1, 2, 3) draft and target logits whose softmaxes are HAND_Q and HAND_P."""
    return torch.tensor([HAND_Q]).log(), torch.tensor([HAND_P]).log()


def test_tv_by_hand():
    draft, target = hand_logits()
    loss, grad = value_and_grad(lambda z: draft_loss("tv", z[:, :1], target[:, :1]), draft)
    torch.testing.assert_close(loss, torch.tensor(0.4))
    torch.testing.assert_close(grad[0, 0], torch.tensor([-0.12, -0.12, 0.24]))
    assert (grad[0, 1] == 0).all()


def test_e2e_tv_by_hand():
    draft, target = hand_logits()
    loss, grad = value_and_grad(lambda z: draft_loss("e2e_tv", z, target), draft)
    torch.testing.assert_close(loss, torch.tensor(0.49))
    step1 = -0.85 * torch.tensor([0.12, 0.12, -0.24])  # dL/dalpha_1 * dalpha_1/dz
    step2 = -0.3 * torch.tensor([-0.125, -0.125, 0.25])  # dL/dalpha_2 * dalpha_2/dz
    torch.testing.assert_close(grad[0], torch.stack([step1, step2]))
    # Cutting step 2 leaves a one-step chain: 1 - alpha_1.
    cut = torch.tensor([[True, False]])
    torch.testing.assert_close(draft_loss("e2e_tv", draft, target, cut), torch.tensor(0.4))


def test_acceptance_stats_by_hand():
    draft, target = hand_logits()
    alpha_rs, alpha_to, entropy = acceptance_stats(draft, target)
    torch.testing.assert_close(alpha_rs, torch.tensor([[0.6, 0.7]]))
    torch.testing.assert_close(alpha_to, torch.tensor([[0.2, 0.8]]))  # p at argmax q
    want_entropy = [-sum(x * math.log(x) for x in row) for row in HAND_P]
    torch.testing.assert_close(entropy, torch.tensor([want_entropy]))


def test_acceptance_stats_match_reference():
    gen = torch.Generator().manual_seed(3)
    draft, target = (torch.randn(2, N, K, V, generator=gen) * 2).unbind(0)
    draft[0, 0, 3] = draft[0, 0, 10] = draft[0, 0].max() + 1  # tie: argmax takes the first
    got = acceptance_stats(draft, target, 0.8, **SMALL_CHUNKS)
    log_p = torch.log_softmax(target.double() / 0.8, -1)
    q, p = torch.softmax(draft.double() / 0.8, -1), log_p.exp()
    want = (
        torch.minimum(p, q).sum(-1),
        p.gather(-1, draft.argmax(-1, keepdim=True)).squeeze(-1),
        -(p * log_p).sum(-1),
    )
    for got_stat, want_stat in zip(got, want):
        assert got_stat.shape == (N, K) and not got_stat.requires_grad
        torch.testing.assert_close(got_stat.double(), want_stat, atol=1e-6, rtol=1e-5)
    assert got[1][0, 0] == p[0, 0, 3].float()


# ---------------------------------------------------------------------------------------------
# Masks, gradients and dtypes.
# ---------------------------------------------------------------------------------------------


def test_e2e_tv_ignores_entries_after_first_false():
    gen = torch.Generator().manual_seed(4)
    draft, target = torch.randn(2, 2, K, V, generator=gen).unbind(0)
    mask = torch.tensor([[True, False, True, True], [False, True, True, True]])
    loss, grad = value_and_grad(lambda z: draft_loss("e2e_tv", z, target, mask), draft)
    assert (grad[0, 1:] == 0).all() and (grad[1] == 0).all()
    torch.testing.assert_close(loss, draft_loss("tv", draft[:1, :1], target[:1, :1]))


@pytest.mark.parametrize("name", NAMES)
def test_nothing_valid_gives_zero(name):
    draft = torch.randn(2, 3, 7, requires_grad=True)
    loss = draft_loss(name, draft, torch.randn(2, 3, 7), torch.zeros(2, 3, dtype=torch.bool))
    loss.backward()
    assert loss.item() == 0.0 and (draft.grad == 0).all()


@pytest.mark.parametrize("name", NAMES)
def test_target_gets_no_gradient(name):
    draft = torch.randn(3, 2, 9, requires_grad=True)
    target = torch.randn(3, 2, 9, requires_grad=True)
    draft_loss(name, draft, target, temperature=1.3).backward()
    assert target.grad is None
    assert draft.grad is not None and draft.grad.abs().sum() > 0


def test_rkl_with_underflowing_target_stays_finite():
    gen = torch.Generator().manual_seed(5)
    draft = torch.randn(2, 3, 11, generator=gen)
    target = torch.randn(2, 3, 11, generator=gen)
    target[..., :4] = -1000.0  # p = exp(-1000) = 0 in float32 and float64 where q > 0
    mask = torch.ones(2, 3, dtype=torch.bool)
    got, got_grad = value_and_grad(lambda z: draft_loss("rkl", z, target, mask), draft)
    want, want_grad = value_and_grad(lambda z: reference_loss("rkl", z, target, mask, 1.0), draft)
    assert torch.isfinite(got) and torch.isfinite(got_grad).all()
    torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(got_grad, want_grad, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_bfloat16_accumulates_in_float32(name):
    gen = torch.Generator().manual_seed(6)
    draft, target = (torch.randn(2, N, K, V, generator=gen) * 2).bfloat16().unbind(0)
    mask = torch.ones(N, K, dtype=torch.bool)
    got, got_grad = value_and_grad(lambda z: draft_loss(name, z, target, **SMALL_CHUNKS), draft)
    want, want_grad = value_and_grad(lambda z: reference_loss(name, z, target, mask, 1.0), draft)
    assert got.dtype == torch.float32 and got_grad.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_grad.float(), want_grad.float(), atol=1e-4, rtol=1e-2)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    shape=st.tuples(st.integers(1, 4), st.integers(1, 5), st.integers(1, 12)),
    scale=st.floats(0.1, 20.0),
    temperature=st.floats(0.2, 3.0),
)
def test_bounds(seed, shape, scale, temperature):
    gen = torch.Generator().manual_seed(seed)
    draft, target = (torch.randn(2, *shape, generator=gen) * scale).unbind(0)
    mask = torch.rand(shape[:2], generator=gen) > 0.2
    for name in ("tv", "e2e_tv"):
        value = draft_loss(name, draft, target, mask, temperature).item()
        assert -1e-6 <= value <= 1 + 1e-6, (name, value)
    for name in ("fkl", "rkl"):
        assert draft_loss(name, draft, target, mask, temperature).item() >= -1e-5
    alpha_rs, alpha_to, entropy = acceptance_stats(draft, target, temperature)
    assert ((alpha_rs >= -1e-6) & (alpha_rs <= 1 + 1e-6)).all()
    assert ((alpha_to >= 0) & (alpha_to <= 1 + 1e-6)).all()
    assert ((entropy >= -1e-5) & (entropy <= math.log(shape[2]) + 1e-5)).all()


# ---------------------------------------------------------------------------------------------
# Input checks.
# ---------------------------------------------------------------------------------------------


def test_registry_names():
    assert sorted(DRAFT_LOSSES) == sorted(NAMES)


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match="unknown draft loss") as info:
        draft_loss("kl", torch.randn(1, 1, 3), torch.randn(1, 1, 3))
    for name in NAMES:
        assert name in str(info.value)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("side", ["draft", "target"])
def test_non_finite_logits_raise(bad, side):
    draft, target = torch.randn(2, 3, 5), torch.randn(2, 3, 5)
    (draft if side == "draft" else target)[1, 2, 4] = bad
    with pytest.raises(ValueError, match="NaN or inf"):
        draft_loss("tv", draft, target, row_chunk=2)
    with pytest.raises(ValueError, match="NaN or inf"):
        acceptance_stats(draft, target)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"draft": torch.randn(2, 3, 5), "target": torch.randn(2, 3, 6)}, "same"),
        ({"draft": torch.randn(6, 5), "target": torch.randn(6, 5)}, "3-D"),
        ({"draft": torch.randint(0, 3, (2, 3, 5)), "target": torch.randn(2, 3, 5)}, "floating"),
        ({"mask": torch.ones(2, 3)}, "bool"),
        ({"mask": torch.ones(3, 2, dtype=torch.bool)}, "shape"),
        ({"temperature": 0.0}, "temperature"),
        ({"temperature": -1.0}, "temperature"),
    ],
)
def test_bad_inputs_raise(kwargs, match):
    args = {"draft": torch.randn(2, 3, 5), "target": torch.randn(2, 3, 5), "mask": None}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        draft_loss(
            "e2e_tv", args["draft"], args["target"], args["mask"], args.get("temperature", 1.0)
        )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", NAMES)
def test_cuda_matches_cpu(name):
    gen = torch.Generator().manual_seed(7)
    draft, target = torch.randn(2, N, K, V, generator=gen).unbind(0)
    mask = make_mask("cut", gen)
    cpu, cpu_grad = value_and_grad(lambda z: draft_loss(name, z, target, mask), draft)
    gpu, gpu_grad = value_and_grad(
        lambda z: draft_loss(name, z, target.cuda(), mask.cuda(), **SMALL_CHUNKS), draft.cuda()
    )
    torch.testing.assert_close(gpu.cpu(), cpu, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gpu_grad.cpu(), cpu_grad, atol=1e-5, rtol=1e-5)


def test_every_list_of_losses_names_registered_losses():
    """The named constants and per-loss tables outside ``DRAFT_LOSSES`` hold only its keys (the
    display names and the paper's Table 2 order hold all of them)."""
    from bebop.analysis.findings import LOSS_NAMES, TABLE2_ORDER
    from bebop.config import BASELINE_DRAFT_LOSS, DEFAULT_DRAFT_LOSS
    from bebop.mtp.loss import CHAIN_MEAN_LOSSES
    from bebop.mtp.train import NEEDS_CE_START

    assert {BASELINE_DRAFT_LOSS, DEFAULT_DRAFT_LOSS, *CHAIN_MEAN_LOSSES, *NEEDS_CE_START} <= set(DRAFT_LOSSES)
    assert set(LOSS_NAMES) == set(TABLE2_ORDER) == set(DRAFT_LOSSES)
