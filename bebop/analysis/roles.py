"""Which RL run plays which part in the paper's comparisons, read from its config.

A run's role is its rollout mode, its head's draft loss and how the head is updated (frozen, or
online with some loss). Several runs with one role (seeds) are pooled by the analyses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from bebop.config import BASELINE_DRAFT_LOSS, DEFAULT_DRAFT_LOSS

if TYPE_CHECKING:
    from bebop.analysis.runs import Run

CE_LOSS = BASELINE_DRAFT_LOSS  # the baseline draft loss
TV_LOSS = DEFAULT_DRAFT_LOSS  # the paper's recommended draft loss


def run_mode(run: Run) -> str:
    return str(run.config.get("mode") or "none")


def runs_with(runs: Sequence[Run], mode: str | None, loss: str, update: str = "frozen",
              online_loss: str | None = None) -> list[Run]:
    """Runs whose config matches: mode (None = any speculative mode), head loss, update, online loss."""
    def matches(run: Run) -> bool:
        cfg = run.config
        return (run_mode(run) != "none" and (mode is None or run_mode(run) == mode) and cfg.get("mtp_loss") == loss
                and (cfg.get("mtp_update") or "frozen") == update
                and (online_loss is None or cfg.get("online_loss") == online_loss))
    return [r for r in runs if matches(r)]


def none_runs(runs: Sequence[Run]) -> list[Run]:
    """Runs without speculative decoding (the speed and entropy baseline)."""
    return [r for r in runs if run_mode(r) == "none"]


def headline_roles(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """The three runs of the paper's Figs. 1a/8: TO with a CE head, RS with a CE head, RS with a frozen
    e2e-TV head; roles without a run are left out."""
    roles = {
        "TO + CE head": runs_with(runs, "to", CE_LOSS),
        "RS + CE head": runs_with(runs, "rs", CE_LOSS),
        "RS + e2e-TV head": runs_with(runs, "rs", TV_LOSS),
    }
    return {name: rs for name, rs in roles.items() if rs}
