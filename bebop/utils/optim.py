"""AdamW for weights of any dtype: bfloat16 parameters are updated through float32 master copies.

Every trainable part (the policy in ``bebop rl``, an MTP head in ``train-mtp`` and online RL, the
embedded model in ``pretrain``) lives in the dtype it computes in, the backbone's ``--dtype``, so
the engine drafts and verifies in one dtype and no forward pass needs autocast. A bfloat16 weight
cannot hold a small update: its 8-bit significand rounds away any step below half an ulp (2^-9 of
the weight, 0.2%), and at RL learning rates (1e-6 .. 1e-4) nearly every step would be lost. So for
bfloat16 parameters ``make_adamw`` returns ``MasterWeightAdamW``, the mixed-precision scheme of
Micikevicius et al. 2018 ("Mixed Precision Training") that DeepSpeed's and Megatron's bf16
optimizers use:
  1) the optimizer holds a float32 copy of each parameter (the master weight) and float32 Adam moments;
  2) ``step`` upcasts the bf16 gradients, runs AdamW on the masters, and rounds them into the bf16 weights;
  3) its ``state_dict`` holds the masters, so a resumed run continues from the unrounded weights;
  4) ``master_state_dict`` gives a module's state with the masters in place of its bf16 weights:
     heads and models trained in bf16 are saved in float32 (a load casts them to the backbone's dtype).
float32 parameters get ``torch.optim.AdamW`` itself, unchanged; both run torch's fused AdamW kernel.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

LOW_PRECISION = (torch.bfloat16, torch.float16)  # parameter dtypes that get float32 master weights


class MasterWeightAdamW:
    """``torch.optim.AdamW`` on float32 master copies of low-precision parameters (see the module docstring).

    Quacks like an optimizer where Bebop uses one: ``param_groups`` (the learning-rate schedule
    writes ``group["lr"]``), ``zero_grad``, ``step``, ``state_dict`` and ``load_state_dict``.

    Args:
        params: the model's parameters (bfloat16); their ``.grad`` is read, their values overwritten.
        **adamw_kwargs: ``lr``, ``weight_decay``, ``betas``... for ``torch.optim.AdamW``.
    """

    def __init__(self, params: Iterable[nn.Parameter], **adamw_kwargs):
        self.params = list(params)
        self.masters = [p.detach().to(torch.float32).clone() for p in self.params]
        self.inner = torch.optim.AdamW(self.masters, **adamw_kwargs)

    @property
    def param_groups(self) -> list[dict]:
        return self.inner.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        for p, master in zip(self.params, self.masters):
            master.grad = None if p.grad is None else p.grad.to(torch.float32)
        self.inner.step()
        for p, master in zip(self.params, self.masters):
            p.copy_(master)  # NOTE: rounds to the parameter's dtype; the master keeps every bit
            master.grad = None

    def state_dict(self) -> dict:
        return {"adamw": self.inner.state_dict(), "masters": [m.detach().clone() for m in self.masters]}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        if set(state) != {"adamw", "masters"} or len(state["masters"]) != len(self.masters):
            raise ValueError("optimizer state is not a MasterWeightAdamW state for these parameters "
                             "(was it saved by a run in another dtype?)")
        self.inner.load_state_dict(state["adamw"])
        for p, master, saved in zip(self.params, self.masters, state["masters"]):
            master.copy_(saved)
            p.copy_(master)


def make_adamw(params: Iterable[nn.Parameter], **adamw_kwargs) -> torch.optim.Optimizer | MasterWeightAdamW:
    """AdamW over ``params``: ``MasterWeightAdamW`` when any is bfloat16/float16, else ``torch.optim.AdamW``.

    Example: ``make_adamw(head.parameters(), lr=1e-3)`` trains a bf16 head with float32 master weights.
    """
    params = list(params)
    # NOTE: the fused kernel updates in place: torch's default per-tensor AdamW makes two temporaries the size of
    # the largest parameter (1.2 GB more for a 151,936 x 1,024 embedding, and 2.5x slower: docs/scaling.md).
    adamw_kwargs = {"fused": True, **adamw_kwargs}
    if any(p.dtype in LOW_PRECISION for p in params):
        return MasterWeightAdamW(params, **adamw_kwargs)
    return torch.optim.AdamW(params, **adamw_kwargs)


def master_state_dict(module: nn.Module, optimizer) -> dict[str, torch.Tensor]:
    """``module.state_dict()`` with each parameter that ``optimizer`` keeps a float32 master of replaced by it.

    For a plain optimizer (float32 weights) this is ``module.state_dict()``; tied parameters get the
    same master tensor under each of their names.
    """
    state = module.state_dict()
    if not isinstance(optimizer, MasterWeightAdamW):
        return state
    masters = {p.data_ptr(): m for p, m in zip(optimizer.params, optimizer.masters)}
    return {name: masters.get(t.data_ptr(), t) if t.is_floating_point() else t for name, t in state.items()}
