"""RL checkpoints: every stateful component, the RNG states, the step and the resolved config.

Layout of ``run_dir/checkpoint`` (written in one rename by ``atomic_dir``, so a run killed while
saving keeps the previous checkpoint)::

    config.json        the resolved flat config (``bebop.rl.config.flat_config``)
    trainer_state.json {"step": steps completed, "components": [names]}
    rng.pt             torch (CPU and CUDA), Python ``random`` and NumPy RNG states
    <name>.pt          ``state_dict()`` of each component: policy, policy_optimizer, and when they
                       exist head + head_optimizer (online), reference (kl_coef > 0),
                       sampler_policy + sampler_head (async rollouts)

Components are anything with ``state_dict``/``load_state_dict`` (modules, optimizers), passed by
name, so this module knows nothing about the RL loop. A policy saved here loads into an HF model
with ``model.load_state_dict(torch.load(".../policy.pt"))``.

Sampling uses explicit seeds (``bebop.speculative.rng``), so the RNG states are saved only for
completeness: nothing in ``bebop rl`` draws from the global generators after setup.
"""

from __future__ import annotations

import os
import pickle
import random
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from bebop.config import INT64_MAX, short_repr
from bebop.pretrained import UNPICKLABLE
from bebop.utils.errors import BebopError
from bebop.utils.files import atomic_dir, read_json, save_torch, write_json

CHECKPOINT_DIR = "checkpoint"  # inside the run directory
STATE_FILE = "trainer_state.json"  # step and component names
RNG_FILE = "rng.pt"  # global RNG states


class Stateful(Protocol):
    """A module or optimizer."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> Any: ...


def rng_state() -> dict[str, Any]:
    """The global RNG states as plain tensors and lists (loadable with ``weights_only=True``)."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": [version, list(internal), gauss],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restores what ``rng_state`` returned."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoint_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR


def save_checkpoint(
    run_dir: str | os.PathLike, components: dict[str, Stateful], step: int, config: dict[str, Any]
) -> Path:
    """Writes ``run_dir/checkpoint`` atomically (replacing any previous one).

    Args:
        run_dir: the run directory.
        components: name -> module or optimizer; each is saved as ``<name>.pt``.
        step: RL steps completed.
        config: the resolved flat config.

    Returns:
        The checkpoint directory.
    """
    final = checkpoint_dir(run_dir)
    with atomic_dir(final) as tmp:
        for name, component in components.items():
            save_torch(component.state_dict(), tmp / f"{name}.pt")
        save_torch(rng_state(), tmp / RNG_FILE)
        write_json(tmp / STATE_FILE, {"step": step, "components": sorted(components)})
        write_json(tmp / "config.json", config)
    return final


def has_checkpoint(run_dir: str | os.PathLike) -> bool:
    return (checkpoint_dir(run_dir) / STATE_FILE).is_file()


def _check_config(saved: dict[str, Any], config: dict[str, Any], may_change: tuple[str, ...], where: Path) -> None:
    changed = sorted(k for k in set(saved) | set(config) if k not in may_change and saved.get(k) != config.get(k))
    if changed:
        details = ", ".join(f"{k}: {saved.get(k)!r} -> {config.get(k)!r}" for k in changed)
        allowed = f"only {', '.join(may_change)}" if may_change else "no setting"
        raise BebopError(f"cannot resume from {where}: the config changed ({details}); a resumed run may change "
                         f"{allowed} (for other settings start a new run: --overwrite or another run directory)")


def load_checkpoint(
    run_dir: str | os.PathLike,
    components: dict[str, Stateful],
    config: dict[str, Any],
    may_change: tuple[str, ...] = (),
) -> int:
    """Restores ``components`` and the RNG states from ``run_dir/checkpoint``.

    Args:
        run_dir: the run directory.
        components: name -> module or optimizer to load into (in place); every name must be saved.
        config: the resolved flat config of the resumed run; it must equal the saved one except
            for the keys in ``may_change``.
        may_change: config keys a resumed run may set differently (e.g. ``steps``).

    Returns:
        The number of RL steps the checkpoint had completed.

    Raises:
        BebopError: no checkpoint, a changed config, a missing component, or a corrupt file.
    """
    where = checkpoint_dir(run_dir)
    trainer = read_json(where / STATE_FILE, what="checkpoint state")
    saved = read_json(where / "config.json", what="checkpoint config")
    if not isinstance(saved, dict):
        raise BebopError(f"checkpoint config {where / 'config.json'} is not a table of settings")
    _check_config(saved, config, may_change, where)
    step = _saved_step(trainer, saved, where / STATE_FILE)
    missing = sorted(set(components) - set(trainer.get("components", [])))
    if missing:
        raise BebopError(f"checkpoint {where} lacks {missing}; it holds {trainer.get('components')}")
    for name, component in components.items():
        state = _load_file(where / f"{name}.pt")
        try:
            component.load_state_dict(state)
        except (RuntimeError, ValueError, KeyError) as e:  # shapes or names of another model
            raise BebopError(f"checkpoint file {where / f'{name}.pt'} does not fit this run's {name}: "
                             f"{' '.join(str(e).split())[:300]}") from None
    rng = _load_file(where / RNG_FILE)
    try:
        set_rng_state(rng)
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as e:  # a loadable file of other contents
        raise BebopError(f"corrupt checkpoint file {where / RNG_FILE}: not RNG states ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''})") from None
    return step


def _saved_step(trainer: Any, saved: dict[str, Any], path: Path) -> int:
    """The steps a checkpoint completed, trusted only when they fit its own run: an integer from 0 to the
    ``steps`` of its config (when it records them)."""
    if not isinstance(trainer, dict) or not isinstance(trainer.get("components", []), list):
        raise BebopError(f"checkpoint state {path} is not a table of step and components")
    step, steps = trainer.get("step"), saved.get("steps")
    bound = steps if isinstance(steps, int) and not isinstance(steps, bool) else INT64_MAX
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= bound:
        run = f"a run of {short_repr(steps)} steps" if bound == steps else "a run"
        raise BebopError(f"checkpoint state {path} says step {short_repr(step)}, which {run} never reaches (a step is "
                         f"an integer from 0 to the run's steps)")
    return step


def _load_file(path: Path) -> Any:
    """``torch.load`` of a checkpoint file (tensors and plain containers only); one line when missing or corrupt."""
    if not path.is_file():
        raise BebopError(f"checkpoint file {path} is missing; the checkpoint is incomplete")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise BebopError(f"corrupt checkpoint file {path}: {UNPICKLABLE}") from None
    except Exception as e:  # noqa: BLE001 - any load failure is a corrupt checkpoint
        first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise BebopError(f"corrupt checkpoint file {path}: {first}") from None
