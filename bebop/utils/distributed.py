"""Data parallelism under ``torchrun``: one home for every torch.distributed call Bebop makes.

``torchrun --nproc-per-node N $(which bebop) CMD ...`` starts N processes (ranks) with RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set; ``init_distributed`` joins them into one
process group (gloo on CPU, nccl on CUDA, each CUDA rank on its own GPU). Without torchrun
nothing here is initialised and every helper is a no-op that returns its input unchanged, so a
one-process run is the plain single-process computation.

How the ranks split the work, and why the result equals one process's:
1) Each step's global batch (the same rows as one process would take) is cut into W contiguous
   shards (``shard_range``); the batch size must divide by W.
2) Losses are normalised by the *global* count (tokens, chains), so each rank's loss is its part
   of the global mean; the gradients are then summed over ranks (``sum_gradients``), which gives
   the gradient of the global mean even when ranks hold different numbers of tokens. (A plain
   average of per-rank means would weigh a token on a rank with few tokens more.)
3) Only rank 0 (``is_main``) writes files, log lines and progress bars; every rank reads.

A rank that dies makes the others fail in their next collective: gloo reports the closed
connection at once, and any collective waits at most ``BEBOP_DIST_TIMEOUT_S`` seconds (default
``DEFAULT_TIMEOUT_S``); the CLI turns either into one ``bebop: error:`` line (``lost_rank_message``).
"""

from __future__ import annotations

import datetime
import os
import re

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from bebop.utils.errors import BebopError

DEFAULT_TIMEOUT_S = 600  # the longest a rank waits in a collective (e.g. while rank 0 writes a checkpoint)
TIMEOUT_ENV = "BEBOP_DIST_TIMEOUT_S"  # overrides DEFAULT_TIMEOUT_S


def launched() -> bool:
    """True when this process was started by torchrun (or an equivalent) with more than one rank."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def timeout_s() -> float:
    """Seconds a collective may wait: ``BEBOP_DIST_TIMEOUT_S`` or ``DEFAULT_TIMEOUT_S``."""
    raw = os.environ.get(TIMEOUT_ENV, str(DEFAULT_TIMEOUT_S))
    try:
        value = float(raw)
    except ValueError:
        raise BebopError(f"{TIMEOUT_ENV} must be a number of seconds, got {raw!r}") from None
    if value <= 0:
        raise BebopError(f"{TIMEOUT_ENV} must be > 0, got {raw!r}")
    return value


def init_distributed(device: torch.device) -> None:
    """Joins torchrun's process group: gloo on CPU, nccl on CUDA (this rank on GPU LOCAL_RANK).

    Does nothing without torchrun (WORLD_SIZE unset or 1) or when a group already exists.
    Raises BebopError for a device type no backend serves across processes (mps).
    """
    if not launched() or dist.is_initialized():
        return
    if device.type not in ("cpu", "cuda"):
        raise BebopError(f"torchrun runs on cpu or cuda, not {device.type}")
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))  # NOTE: "cuda" now means this rank's GPU
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s()))
    if backend == "gloo":  # NOTE: names a rank that never arrived, instead of waiting forever
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=timeout_s()))


def initialized() -> bool:
    """True once this process has joined a process group."""
    return dist.is_initialized()


def close_distributed() -> None:
    """Leaves the process group (no-op when there is none)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def world_size() -> int:
    """W, the number of ranks (1 without torchrun)."""
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    """This process's rank in 0..W-1 (0 without torchrun)."""
    return dist.get_rank() if dist.is_initialized() else 0


def is_main() -> bool:
    """True on the rank that writes files, log lines and progress bars (rank 0)."""
    return rank() == 0


def lost_rank_message(error: BaseException) -> str:
    """The one line a rank prints when a collective failed (a peer died or timed out)."""
    first = str(error).splitlines()[0] if str(error) else type(error).__name__
    first = re.sub(r"\[[^\]]*:\d+\] ", "", first).split(". ")[0]  # NOTE: drops gloo's source location and advice
    return (f"rank {rank()} of {world_size()} lost contact with the other ranks (one died, or waited more than "
            f"{timeout_s():g} s, see {TIMEOUT_ENV}): {first[:200]}")


def shard_range(total: int, what: str = "batch size") -> tuple[int, int]:
    """(start, stop): this rank's contiguous share of ``total`` items, which must divide by W.

    Example: total 8 with W = 2 gives (0, 4) on rank 0 and (4, 8) on rank 1; W = 1 gives (0, 8).
    """
    size = world_size()
    if total % size:
        raise BebopError(f"{what} {total} does not split evenly over {size} processes; make it a multiple of {size}")
    per = total // size
    return rank() * per, (rank() + 1) * per


def barrier() -> None:
    """Waits until every rank got here (no-op with one rank)."""
    if world_size() > 1:
        dist.barrier()


def broadcast_module(module: torch.nn.Module) -> None:
    """Copies rank 0's parameters and buffers into every rank's ``module`` (no-op with one rank)."""
    if world_size() == 1:
        return
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src=0)


def sum_gradients(params) -> None:
    """Replaces each gradient by its sum over ranks, all in one flat all-reduce (no-op with one rank).

    A parameter that got no gradient on this rank (None) takes part as zeros, so every rank sends
    the same layout. Parameters sharded by FSDP2 (``shard``) are skipped: FSDP sums their gradients.
    """
    if world_size() == 1:
        return
    params = [p for p in params if p.requires_grad and not isinstance(p, DTensor)]
    if not params:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat)
    offset = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
        offset += n


def sum_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` summed over ranks (a new tensor; the input itself with one rank)."""
    if world_size() == 1:
        return tensor
    out = tensor.detach().clone()
    dist.all_reduce(out)
    return out


def sum_floats(values: dict[str, float]) -> dict[str, float]:
    """Each value summed over ranks, in one all-reduce (float64 on the CPU; the input with one rank)."""
    if world_size() == 1:
        return values
    keys = list(values)
    flat = sum_tensor(_to_comm_device(torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)))
    return dict(zip(keys, flat.cpu().tolist()))


def gather_objects(obj) -> list:
    """Every rank's ``obj`` (picklable), in rank order; ``[obj]`` with one rank."""
    if world_size() == 1:
        return [obj]
    out = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def _to_comm_device(tensor: torch.Tensor) -> torch.Tensor:
    """nccl moves CUDA tensors only; gloo, CPU ones."""
    return tensor.to(comm_device())


# ---------------------------------------------------------------------------------------------- FSDP2


def comm_device() -> torch.device:
    """The device the process group moves tensors on: this rank's GPU under nccl, else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def fsdp_mesh(device: torch.device):
    """The 1-D device mesh of all ranks that ``shard`` splits parameters over."""
    from torch.distributed.device_mesh import init_device_mesh

    if world_size() == 1:
        raise BebopError("--fsdp shards over torchrun's processes; start with torchrun --nproc-per-node N (N >= 2)")
    return init_device_mesh(device.type, (world_size(),))


def shard(module: torch.nn.Module, mesh) -> None:
    """FSDP2 (``fully_shard``) on ``module``: each rank keeps 1/W of its parameters, gathered for its
    forward; the gradients of trainable ones are *summed* over ranks (as ``sum_gradients``)."""
    from torch.distributed.fsdp import fully_shard

    fully_shard(module, mesh=mesh)
    module.set_gradient_divide_factor(1.0)
    module.set_force_sum_reduction_for_comms(True)  # NOTE: gloo has no PREMUL_SUM


def _full_options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_state_dicts(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """(module, optimizer) state dicts of an FSDP2-sharded ``module``, gathered in full on rank 0 (empty on
    the others), the optimizer's in ``Optimizer.state_dict``'s layout (parameters by index), so a
    one-process run can load them. A collective: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    model_state = get_model_state_dict(module, options=_full_options())
    optim_state = get_optimizer_state_dict(module, optimizer, options=_full_options())
    if not is_main():
        return {}, {}
    index = {name: i for i, (name, _) in enumerate(module.named_parameters())}
    groups = [{**g, "params": [index[k] for k in g["params"]]} for g in optim_state["param_groups"]]
    optim_state = {"state": {index[k]: v for k, v in optim_state["state"].items()}, "param_groups": groups}
    return model_state, optim_state


def load_full_optimizer_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Loads a full ``Optimizer.state_dict`` (parameters by index, every rank holds it) into the optimizer of
    an FSDP2-sharded ``module``; each rank keeps its shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    if not state.get("state"):
        return
    names = [name for name, _ in module.named_parameters()]
    by_name = {"state": {names[i]: v for i, v in state["state"].items()},
               "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]}
    set_optimizer_state_dict(module, optimizer, by_name, options=StateDictOptions(full_state_dict=True))
