"""Which RL run plays which part in the paper's comparisons, read from its config.

A run's role is its rollout mode, its head's draft loss, how the head is updated (frozen, or
online with some loss) and whether rollouts ran asynchronously (``async_rollout``: the next step
sampled while this one updates, so its step time is not a synchronous run's). Several runs with
one role (seeds) are pooled by the analyses; runs of different roles never are.
"""

from __future__ import annotations

from collections.abc import Sequence

from bebop.analysis.runs import Run, run_label
from bebop.config import BASELINE_DRAFT_LOSS, DEFAULT_DRAFT_LOSS

CE_LOSS = BASELINE_DRAFT_LOSS  # the baseline draft loss
TV_LOSS = DEFAULT_DRAFT_LOSS  # the paper's recommended draft loss


def run_mode(run: Run) -> str:
    return str(run.config.get("mode") or "none")


def is_async(run: Run) -> bool:
    """Whether the run sampled each step's rollouts while the previous step updated (``async_rollout``)."""
    return run.config.get("async_rollout") is True


def runs_with(runs: Sequence[Run], mode: str | None, loss: str, update: str = "frozen",
              online_loss: str | None = None, async_rollout: bool = False) -> list[Run]:
    """Runs whose config matches: mode (None = any speculative mode), head loss, update, online loss, and
    synchronous or asynchronous rollouts (the paper's runs are synchronous)."""
    def matches(run: Run) -> bool:
        cfg = run.config
        return (run_mode(run) != "none" and (mode is None or run_mode(run) == mode) and cfg.get("mtp_loss") == loss
                and (cfg.get("mtp_update") or "frozen") == update and is_async(run) == async_rollout
                and (online_loss is None or cfg.get("online_loss") == online_loss))
    return [r for r in runs if matches(r)]


def none_runs(runs: Sequence[Run], async_rollout: bool | None = None) -> list[Run]:
    """Runs without speculative decoding (the speed and entropy baseline); with ``async_rollout`` given, only
    the synchronous (False) or asynchronous (True) ones."""
    return [r for r in runs if run_mode(r) == "none" and async_rollout in (None, is_async(r))]


def baseline_runs(runs: Sequence[Run], role_runs: Sequence[Run]) -> list[Run]:
    """The ``none`` runs a role's step time is compared with: those as synchronous or asynchronous as the role's
    runs when there are any, else the others (never both pooled)."""
    if not role_runs:
        return none_runs(runs)
    kind = is_async(role_runs[0])  # NOTE: a role's runs share it (``role_name``)
    return none_runs(runs, kind) or none_runs(runs, not kind)


def role_name(run: Run) -> str:
    """The run's role as a label without its seed or name: mode, head loss, update, ``+async`` for asynchronous
    rollouts and ``trl:`` for TRL runs.

    Example: a run labelled "rs+e2e_tv-seed1" with mode rs and head loss e2e_tv has role "rs+e2e_tv"; with
    ``async_rollout`` true, "rs+e2e_tv+async".
    """
    cfg = run.config
    name = run_label({key: cfg.get(key) for key in ("mode", "mtp_loss", "mtp_update", "online_loss", "async_rollout")})
    return f"trl:{name}" if cfg.get("trainer") == "trl" else name


def speculative_roles(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """The runs with speculative rollouts grouped by ``role_name``, in the order the roles first appear."""
    roles: dict[str, list[Run]] = {}
    for run in runs:
        if run_mode(run) != "none":
            roles.setdefault(role_name(run), []).append(run)
    return roles


def answer_role(runs: Sequence[Run]) -> tuple[str, list[Run]] | None:
    """The role the report's answer is about: the paper's recipe (rs, frozen e2e-TV head) when a run has it,
    else the first speculative role; None without speculative runs."""
    roles = speculative_roles(runs)
    recipe = runs_with(runs, "rs", TV_LOSS)
    if recipe:
        name = role_name(recipe[0])
        return name, roles[name]
    return next(iter(roles.items()), None)
