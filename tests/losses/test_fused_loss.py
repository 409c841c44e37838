"""draft_loss_from_hidden: the draft losses fused with the lm_head against draft_loss on the logits."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from bebop.losses import DRAFT_LOSSES, acceptance_stats, draft_loss, draft_loss_from_hidden
from bebop.losses import entry_stats
from bebop.losses.draft import DRAFT_LOSS_PARTS
from bebop.speculative.attention import final_logits
from bebop.utils.errors import BebopError

NAMES = list(DRAFT_LOSSES)
N, K, D, V = 5, 4, 6, 23
SMALL_CHUNKS = {"row_chunk": 3, "vocab_chunk": 7}  # 23 columns -> 4 vocab tiles, the last one short


def make_mask(kind: str, gen: torch.Generator) -> torch.Tensor | None:
    """(N, K) masks: none, random, cut (an empty row, a chain cut at step 1, a False mid-chain), empty."""
    if kind == "none":
        return None
    if kind == "empty":
        return torch.zeros(N, K, dtype=torch.bool)
    mask = torch.rand(N, K, generator=gen) > 0.3
    if kind == "cut":
        mask[1] = False
        mask[2] = torch.tensor([False, True, True, True])
        mask[3] = torch.tensor([True, True, False, True])
    return mask


def fused_and_plain(name, hidden, target_hidden, weight, mask, temperature, target_as, chunks):
    """(value, d/d hidden, d/d weight) of the fused loss and of draft_loss on the logits."""
    results = []
    for fused in (True, False):
        h = hidden.detach().clone().requires_grad_(True)
        w = weight.detach().clone().requires_grad_(True)
        target_logits = target_hidden @ w.detach().T  # (N, K, V)
        if fused:
            target = target_hidden if target_as == "hidden" else target_logits
            loss = draft_loss_from_hidden(name, h, target, w, mask, temperature, **chunks)
        else:
            loss = draft_loss(name, h @ w.T, target_logits, mask, temperature)
        loss.backward()
        results.append((loss.detach(), h.grad, w.grad))
    return results


@pytest.mark.parametrize("chunks", [SMALL_CHUNKS, {}], ids=["small_tiles", "default_tiles"])
@pytest.mark.parametrize("target_as", ["hidden", "logits"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("mask_kind", ["none", "random", "cut", "empty"])
@pytest.mark.parametrize("name", NAMES)
def test_matches_draft_loss(name, mask_kind, temperature, target_as, chunks):
    gen = torch.Generator().manual_seed(7 * NAMES.index(name) + len(mask_kind))
    hidden, target_hidden = (torch.randn(N, K, D, generator=gen) for _ in range(2))
    weight = torch.randn(V, D, generator=gen)
    mask = make_mask(mask_kind, gen)
    (got, got_h, got_w), (want, want_h, want_w) = fused_and_plain(
        name, hidden, target_hidden, weight, mask, temperature, target_as, chunks
    )
    assert got.dtype == torch.float32 and got.shape == ()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_h, want_h, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_w, want_w, atol=1e-5, rtol=1e-5)
    if mask_kind == "empty":
        assert got == 0.0 and not got_h.any() and not got_w.any()


def test_every_draft_loss_is_fused():
    assert list(DRAFT_LOSS_PARTS) == list(DRAFT_LOSSES)


def test_identity_weight_is_draft_loss_on_the_hidden_states():
    """Worked case: with weight = I (D = V), the hidden states are the logits."""
    gen = torch.Generator().manual_seed(3)
    draft, target = (torch.randn(2, 3, 5, generator=gen) for _ in range(2))
    for name in NAMES:
        got = draft_loss_from_hidden(name, draft, target, torch.eye(5), target_is_hidden=True)
        torch.testing.assert_close(got, draft_loss(name, draft, target))
        with pytest.raises(BebopError, match="D = V = 5: say whether target holds hidden states"):
            draft_loss_from_hidden(name, draft, target, torch.eye(5))


def test_alpha_is_the_acceptance_probability():
    gen = torch.Generator().manual_seed(4)
    hidden, target_hidden = (torch.randn(N, K, D, generator=gen) for _ in range(2))
    weight = torch.randn(V, D, generator=gen)
    mask = make_mask("cut", gen)
    alpha_rs, _, _ = acceptance_stats(hidden @ weight.T, target_hidden @ weight.T, 0.7)
    for name in NAMES:
        _, alpha = draft_loss_from_hidden(
            name, hidden, target_hidden, weight, mask, 0.7, with_alpha=True, **SMALL_CHUNKS
        )
        torch.testing.assert_close(alpha, torch.where(mask, alpha_rs, 0.0), atol=1e-6, rtol=1e-6)


def test_target_softcap_matches_capped_logits():
    gen = torch.Generator().manual_seed(5)
    hidden, target_hidden = (torch.randn(N, K, D, generator=gen) * 3 for _ in range(2))
    weight = torch.randn(V, D, generator=gen)
    capped = final_logits(type("Config", (), {"final_logit_softcapping": 2.0})(), target_hidden @ weight.T)
    for name in NAMES:
        got = draft_loss_from_hidden(name, hidden, target_hidden, weight, target_softcap=2.0)
        torch.testing.assert_close(got, draft_loss(name, hidden @ weight.T, capped))
        assert not torch.allclose(got, draft_loss_from_hidden(name, hidden, target_hidden, weight))


@pytest.mark.parametrize("name", NAMES)
def test_bfloat16_inputs_accumulate_in_float32(name):
    """bf16 hidden states and weight whose logits are exact in bf16 (small multiples of 1/4), V = 4096:
    the loss must match a float64 reference to float32 accuracy; float16/bfloat16 softmaxes or sums would
    be off by ~1e-3."""
    gen = torch.Generator().manual_seed(6)
    vocab, width = 4096, 4
    hidden = torch.randint(-2, 3, (3, 2, width), generator=gen).float()
    target_hidden = torch.randint(-2, 3, (3, 2, width), generator=gen).float()
    weight = torch.randint(-2, 3, (vocab, width), generator=gen).float() / 4  # logits in [-4, 4] step 1/4
    h = hidden.bfloat16().requires_grad_(True)
    loss = draft_loss_from_hidden(name, h, target_hidden.bfloat16(), weight.bfloat16(), temperature=0.5)
    loss.backward()
    ref_h = hidden.double().requires_grad_(True)
    want = draft_loss(name, ref_h @ weight.double().T, target_hidden.double() @ weight.double().T, temperature=0.5)
    want.backward()
    assert loss.dtype == torch.float32 and h.grad.dtype == torch.bfloat16
    torch.testing.assert_close(loss.double(), want, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(h.grad.double(), ref_h.grad, atol=1e-3, rtol=1e-2)  # bf16 gradient


class _LargestOutput(TorchDispatchMode):
    """Records the largest number of elements of any new tensor an op returns (views of an op's
    inputs, such as reshapes of the target, allocate nothing and are not counted)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
        shared = {x.untyped_storage().data_ptr() for x in inputs}
        for x in tree_flatten(out)[0]:
            if isinstance(x, torch.Tensor) and x.untyped_storage().data_ptr() not in shared:
                self.largest = max(self.largest, x.numel())
        return out


@pytest.mark.parametrize("target_as", ["hidden", "logits"])
@pytest.mark.parametrize("name", NAMES)
def test_statistics_tiles_inside_a_row_chunk(name, target_as, monkeypatch):
    """Statistics tiles of 2 rows inside matmul chunks of 5 (the last tile of each chunk short), 3
    vocab tiles: the gradient written over a tile's logits must not reach the next tile's."""
    monkeypatch.setattr(entry_stats, "TILE_ELEMENTS", 2 * 9)  # 2 rows of 9 columns per tile
    gen = torch.Generator().manual_seed(11 + NAMES.index(name))
    hidden, target_hidden = (torch.randn(N, K, D, generator=gen) for _ in range(2))
    weight = torch.randn(V, D, generator=gen)
    (fused, fused_h, fused_w), (plain, plain_h, plain_w) = fused_and_plain(
        name, hidden, target_hidden, weight, make_mask("cut", gen), 0.7, target_as,
        {"row_chunk": 5, "vocab_chunk": 9})
    torch.testing.assert_close(fused, plain, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fused_h, plain_h, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fused_w, plain_w, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("target_as", ["hidden", "logits"])
@pytest.mark.parametrize("name", NAMES)
def test_never_allocates_n_k_v(name, target_as):
    """No op of the fused forward + backward (weight gradient included) returns N*K/4 rows of V
    logits; the plain loss on the same inputs does (so the probe can fail)."""
    num, depth, width, vocab, row_chunk = 8, 4, 6, 50, 2
    gen = torch.Generator().manual_seed(8)
    hidden = torch.randn(num, depth, width, generator=gen, requires_grad=True)
    target_hidden = torch.randn(num, depth, width, generator=gen)
    weight = torch.randn(vocab, width, generator=gen, requires_grad=True)
    target = target_hidden if target_as == "hidden" else None
    if target is None:
        target = (target_hidden @ weight.detach().T).detach()  # an input: made outside the probe
    limit = num * depth * vocab // 4  # 400 elements: above a row chunk's logits (2 * 2 * 50)
    assert max(weight.numel(), hidden.numel()) < limit
    with _LargestOutput() as probe:
        draft_loss_from_hidden(name, hidden, target, weight, row_chunk=row_chunk).backward()
    assert probe.largest < limit
    with _LargestOutput() as probe:
        draft_loss(name, hidden @ weight.T, target_hidden @ weight.T).backward()
    assert probe.largest >= num * depth * vocab


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda a: {**a, "draft_hidden": torch.randn(N, K, D + 1)}, r"does not fit the lm_head weight \(V, D\)"),
        (lambda a: {**a, "target": torch.randn(N, K, 9)}, "must be hidden states"),
        (lambda a: {**a, "target": torch.randn(N + 1, K, D)}, "must be hidden states"),
        (lambda a: {**a, "weight": torch.randn(V, D).double()}, "is torch.float32 but the weight is torch.float64"),
        (lambda a: {**a, "draft_hidden": torch.full((N, K, D), float("nan"))}, "draft_hidden contains NaN or inf"),
        (lambda a: {**a, "weight": torch.full((V, D), float("inf"))}, "weight contains NaN or inf"),
        (lambda a: {**a, "name": "kl"}, "unknown draft loss 'kl'"),
        (lambda a: {**a, "temperature": 0.0}, "temperature must be a finite number > 0"),
        (lambda a: {**a, "mask": torch.ones(N, K)}, "mask must be a bool tensor"),
        (lambda a: {**a, "target": torch.randn(N, K, V), "target_softcap": 30.0}, "used with a hidden target"),
    ],
)
def test_bad_input_is_one_line(change, match):
    args = {"name": "tv", "draft_hidden": torch.randn(N, K, D), "target": torch.randn(N, K, D),
            "weight": torch.randn(V, D), "mask": None, "temperature": 1.0}
    args = change(args)
    softcap = args.pop("target_softcap", None)
    with pytest.raises(BebopError, match=match) as info:
        draft_loss_from_hidden(**args, target_softcap=softcap)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", NAMES)
def test_no_chains_gives_zero(name):
    """N = 0 (a batch whose completions hold no chain) used to fail reshaping the empty target."""
    hidden = torch.zeros(0, K, D, requires_grad=True)
    loss = draft_loss_from_hidden(name, hidden, torch.zeros(0, K, D), torch.randn(V, D))
    loss.backward()
    assert loss == 0.0 and hidden.grad.shape == (0, K, D)
