"""``evaluate_mtp``: exact acceptance of a head along teacher-forced chains, no sampling noise.

At every chain start t and step j <= K: alpha_RS,j = sum_v min(p_j, q_j) (rejection sampling)
and alpha_TO,j = p_j(argmax q_j) (target-only). Per chain E[L] = sum_j prod_{i<=j} alpha_i, and
accept length = 1 + E[L] (the bonus/recovered token included, vLLM's convention). Per-step
means average every valid (chain, step); E[L] averages the chains with all K steps inside the
sequence (a cut chain would count as shorter, not as worse).
"""

from __future__ import annotations

import torch

from bebop.losses import acceptance_stats
from bebop.mtp.chains import check_chain_context, check_head_context
from bebop.mtp.data import Sequences, chain_tensors, check_chain_args
from bebop.utils import distributed


@torch.no_grad()
def evaluate_mtp(
    backbone, head, data: Sequences, speculate_k: int = 3, temperature: float = 1.0, batch_size: int = 32,
    pad_id: int = 0, chain_context: str = "served",
) -> dict:
    """Returns ``alpha_rs``/``alpha_to`` (lists of K), ``accept_length_rs``/``accept_length_to``,
    ``target_entropy`` (mean nats over chain steps), ``num_positions`` (chains) and ``num_full_chains``;
    ``chain_context`` is the attention context of depths >= 2 (``bebop.mtp.chains``; "served" = the engine's).

    Under torchrun the batches are dealt out to the ranks in turn and every rank folds all batches'
    sums in batch order, so the result is the one process's, bit for bit.
    """
    check_chain_args(data, speculate_k, temperature)
    check_chain_context(chain_context)
    check_head_context(head, chain_context)
    device = next(backbone.parameters()).device
    starts = list(range(0, len(data), batch_size))
    mine = {i: _batch_sums(backbone, head, data, range(i, min(i + batch_size, len(data))), speculate_k, temperature,
                           pad_id, chain_context, device)
            for n, i in enumerate(starts) if n % distributed.world_size() == distributed.rank()}
    parts = {i: sums for ranks in distributed.gather_objects(mine) for i, sums in ranks.items()}
    sums = {"rs": torch.zeros(speculate_k), "to": torch.zeros(speculate_k), "count": torch.zeros(speculate_k)}
    el = {"rs": 0.0, "to": 0.0}
    entropy_sum, num_chains, num_full = 0.0, 0, 0
    for i in starts:  # NOTE: in batch order, as one process adds them
        part = parts[i]
        for key in sums:
            sums[key] += part[key]
        entropy_sum += part["entropy"]
        num_chains += part["num_chains"]
        num_full += part["num_full"]
        el["rs"] += part["el_rs"]
        el["to"] += part["el_to"]
    count = sums["count"].clamp_min(1)
    return {
        "alpha_rs": (sums["rs"] / count).tolist(),
        "alpha_to": (sums["to"] / count).tolist(),
        "accept_length_rs": 1.0 + el["rs"] / max(num_full, 1),
        "accept_length_to": 1.0 + el["to"] / max(num_full, 1),
        "target_entropy": entropy_sum / float(sums["count"].sum().clamp_min(1)),
        "num_positions": num_chains,
        "num_full_chains": num_full,
        "speculate_k": speculate_k,
        "temperature": temperature,
        "chain_context": chain_context,
    }


def _batch_sums(backbone, head, data: Sequences, rows: range, speculate_k: int, temperature: float, pad_id: int,
                chain_context: str, device: torch.device) -> dict:
    """One batch's sums over its chains (CPU tensors (K,) and floats): what ``evaluate_mtp`` adds up."""
    ids, lengths, starts = data.batch(list(rows), pad_id, device)
    draft, target, mask = chain_tensors(backbone, head, ids, lengths, starts, speculate_k, chain_context)
    alpha_rs, alpha_to, ent = acceptance_stats(draft, target, temperature=temperature)
    m = mask.float().cpu()
    full = mask.all(1).cpu()
    return {
        "rs": (alpha_rs.cpu() * m).sum(0),
        "to": (alpha_to.cpu() * m).sum(0),
        "count": m.sum(0),
        "entropy": float((ent.cpu() * m).sum()),
        "num_chains": mask.shape[0],
        "num_full": int(full.sum()),
        "el_rs": float(alpha_rs.cpu()[full].cumprod(1).sum()),
        "el_to": float(alpha_to.cpu()[full].cumprod(1).sum()),
    }


def acceptance_table(results: dict[str, dict]) -> str:
    """Markdown table of eval-mtp results: per-step RS/TO acceptance and accept lengths.

    Example row: ``| e2e_tv | 0.912 0.871 0.830 | 0.901 0.850 0.805 | 3.366 | 3.283 | 0.450 |``.
    """
    lines = [
        "| head | alpha_RS per step | alpha_TO per step | accept length RS | accept length TO | H(p) nats |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        rs = " ".join(f"{a:.3f}" for a in r["alpha_rs"])
        to = " ".join(f"{a:.3f}" for a in r["alpha_to"])
        lines.append(f"| {name} | {rs} | {to} | {r['accept_length_rs']:.3f} | {r['accept_length_to']:.3f} | "
                     f"{r['target_entropy']:.3f} |")
    return "\n".join(lines)
