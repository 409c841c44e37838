"""``TrainMtpConfig``: how ``bebop train-mtp`` trains a head, each field with its help (``option``).

Nothing here imports torch: the CLI builds train-mtp's flags and --help from this module
(``bebop.config.flags_of``), one flag per field.
"""

from __future__ import annotations

from dataclasses import dataclass

from bebop.config import (
    DEFAULT_DRAFT_LOSS,
    DRAFT_LOSS_NAMES,
    SEED,
    Setting,
    fixed_speculate_k,
    integer_in,
    number_in,
    option,
    positive_temperature,
)

INITS = ("auto", "native", "backbone")  # where a new head starts (TrainMtpConfig.init)
CHAIN_CONTEXTS = ("served", "unrolled")  # the keys of bebop.mtp.chains.CHAIN_UNROLLS, without torch (--help)
LOSS_TEMPERATURE = Setting(1.0, "softmax temperature of p and q in a head's loss and acceptance (> 0)",
                           check=positive_temperature)  # train-mtp's and eval-mtp's


@dataclass(frozen=True)
class TrainMtpConfig:
    """How a head is trained."""

    loss: str = option(DEFAULT_DRAFT_LOSS, "draft objective", choices=DRAFT_LOSS_NAMES)
    speculate_k: int = option(5, "K, head steps unrolled per position in training; deeper than generate's and rl's "
                              "K (3), so every depth they may draft is trained; data with shorter completions "
                              "needs a smaller K", check=fixed_speculate_k)
    steps: int = option(300, "optimizer steps", check=integer_in(1))
    batch_size: int = option(32, "sequences per step", check=integer_in(1))
    lr: float = option(1e-3, "peak AdamW learning rate")
    warmup_steps: int = option(10, "steps of linear warmup, then a constant rate", check=integer_in(0))
    weight_decay: float = option(0.0, "AdamW weight decay")
    grad_clip: float = option(1.0, "max gradient norm", check=number_in(0, float("inf"), low_open=True))
    temperature: float = LOSS_TEMPERATURE.field()
    num_layers: int = option(1, "physical MTP layers of a new head (native and --init-from heads keep theirs)",
                             check=integer_in(1))
    init: str = option("auto", "where a new head starts: the checkpoint's own MTP layer (native), a copy of the "
                       "backbone's last attention layer (backbone), or native when the model ships one (auto)",
                       choices=INITS)
    init_from: str = option("", "start from this head directory instead (e.g. a CE-trained head)", role="input")
    ce_warmup: int = option(-1, "CE steps before the loss, within the steps; -1 = auto: half the steps when a "
                            "tv/e2e_tv head starts from the backbone's layer (TV losses fine-tune a CE-trained "
                            "head), else 0", check=integer_in(-1))
    chain_context: str = option("served", "what draft steps >= 2 attend to: the engine's context, committed "
                                "depth-1 keys then the chain's own (served; one-layer heads), or their own "
                                "depth's keys at earlier positions (unrolled); see bebop.mtp.chains",
                                choices=CHAIN_CONTEXTS)
    seed: int = SEED.field()
    save_every: int = option(100, "checkpoint every this many steps; 0 = only at the end", check=integer_in(0))
    log_every: int = option(25, "one fixed-format line every this many steps", check=integer_in(1))
