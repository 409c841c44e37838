"""``evaluate_mtp``: exact acceptance of a head along teacher-forced chains, no sampling noise.

At every chain start t and step j <= K: alpha_RS,j = sum_v min(p_j, q_j) (rejection sampling)
and alpha_TO,j = p_j(argmax q_j) (target-only). Per chain E[L] = sum_j prod_{i<=j} alpha_i, and
accept length = 1 + E[L] (the bonus/recovered token included, vLLM's convention). Per-step
means average every valid (chain, step); E[L] averages the chains with all K steps inside the
sequence (a cut chain would count as shorter, not as worse).

The accept lengths' 95% intervals are over rows (sequences): chains of one row are not independent,
so a row's chains count as one cluster (the ratio estimator's variance, sum over rows of
(S_r - R N_r)^2 / (sum N)^2 * n / (n - 1), with S_r the row's summed E[L], N_r its full chains).

Block verification (``bebop.speculative.block``) is scored on the same chains with the same
premise (p_j, q_j fixed along a chain, drafts ŷ_j ~ q_j): E[L] = sum_j E[w_j], exact while the
V^(K-1) prefix weights of a chain fit ``block.EXACT_MAX_ATOMS``, else a Monte Carlo mean over
``block.MC_DRAWS`` draft chains per chain with a 95% normal interval of the draws
(``accept_length_block_ci95``). The draws read p and q at the drawn tokens only (``_sampled_block_sums``).

Several drafts per row (``bebop.speculative.multidraft``) are scored on the same chains with the same
premise: n i.i.d. first drafts accepted with the multi-round probability at depth 1, the kept chain's
α at depths >= 2 (``accept_length_multi``, keyed by n).
"""

from __future__ import annotations

import torch

from bebop.losses import acceptance_stats
from bebop.speculative import block
from bebop.speculative.multidraft import multi_draft_expected_accepts
from bebop.mtp.chains import check_chain_context, check_head_context
from bebop.mtp.data import Sequences, chain_starts, chain_states, check_chain_args
from bebop.speculative.attention import final_logits
from bebop.utils import distributed

MULTI_DRAFTS = (2, 4)  # drafts per row at depth 1 scored beside the one chain (n = 1 is accept_length_rs)


@torch.no_grad()
def evaluate_mtp(
    backbone, head, data: Sequences, speculate_k: int = 3, temperature: float = 1.0, batch_size: int = 32,
    pad_id: int = 0, chain_context: str = "served", num_drafts: tuple[int, ...] = MULTI_DRAFTS,
) -> dict:
    """Returns ``alpha_rs``/``alpha_to`` (lists of K), ``accept_length_rs``/``accept_length_to``,
    ``accept_length_block`` (rs with block verification; ``accept_length_block_ci95`` its 95% half-width,
    0 when ``accept_length_block_method`` is "exact"),
    ``accept_length_multi`` ({n: rs accept length with n drafts at depth 1} for n in ``num_drafts``),
    ``target_entropy`` (mean nats over chain steps), ``num_rows`` (sequences), ``num_positions`` (chains) and
    ``num_full_chains``; ``accept_length_rs_ci95``/``accept_length_to_ci95`` are 95% half-widths over rows
    (None below 2 rows with a full chain); ``chain_context`` is the attention context of depths >= 2
    (``bebop.mtp.chains``; "served" = the engine's).

    Under torchrun the batches are dealt out to the ranks in turn and every rank folds all batches'
    sums in batch order, so the result is the one process's, bit for bit.
    """
    check_chain_args(data, speculate_k, temperature)
    check_chain_context(chain_context)
    check_head_context(head, chain_context)
    device = next(backbone.parameters()).device
    starts = list(range(0, len(data), batch_size))
    mine = {i: _batch_sums(backbone, head, data, range(i, min(i + batch_size, len(data))), speculate_k, temperature,
                           pad_id, chain_context, device, num_drafts)
            for n, i in enumerate(starts) if n % distributed.world_size() == distributed.rank()}
    parts = {i: sums for ranks in distributed.gather_objects(mine) for i, sums in ranks.items()}
    sums = {"rs": torch.zeros(speculate_k), "to": torch.zeros(speculate_k), "count": torch.zeros(speculate_k)}
    el = {"rs": 0.0, "to": 0.0, "block": 0.0, "block_var": 0.0, **{f"multi{n}": 0.0 for n in num_drafts}}
    rows = dict.fromkeys(ROW_SUMS, 0.0)
    entropy_sum, num_chains, num_full = 0.0, 0, 0
    for i in starts:  # NOTE: in batch order, as one process adds them
        part = parts[i]
        for key in sums:
            sums[key] += part[key]
        entropy_sum += part["entropy"]
        num_chains += part["num_chains"]
        num_full += part["num_full"]
        for key in el:
            el[key] += part["el_" + key]
        for key in rows:
            rows[key] += part[key]
    count = sums["count"].clamp_min(1)
    full = max(num_full, 1)
    return {
        "alpha_rs": (sums["rs"] / count).tolist(),
        "alpha_to": (sums["to"] / count).tolist(),
        "accept_length_rs": 1.0 + el["rs"] / max(num_full, 1),
        "accept_length_to": 1.0 + el["to"] / max(num_full, 1),
        "accept_length_rs_ci95": _row_ci95(rows, "rs", el["rs"], num_full),
        "accept_length_to_ci95": _row_ci95(rows, "to", el["to"], num_full),
        "accept_length_block": 1.0 + el["block"] / full,
        "accept_length_block_ci95": BLOCK_CI_Z * el["block_var"] ** 0.5 / full,
        "accept_length_multi": {n: 1.0 + el[f"multi{n}"] / full for n in num_drafts},
        "accept_length_block_method": _block_method(backbone.get_output_embeddings().weight.shape[0], speculate_k),
        "target_entropy": entropy_sum / float(sums["count"].sum().clamp_min(1)),
        "num_rows": len(data),
        "num_positions": num_chains,
        "num_full_chains": num_full,
        "speculate_k": speculate_k,
        "temperature": temperature,
        "chain_context": chain_context,
    }


BLOCK_CI_Z = 1.96  # normal quantile of the 95% intervals (block draws, rows)
ROW_SUMS = ("rows_n", "rows_nn", "rows_rs_ss", "rows_rs_sn", "rows_to_ss", "rows_to_sn")  # n, sum N^2, S^2, S N


def _row_ci95(rows: dict, key: str, total_s: float, total_n: int) -> float | None:
    """95% half-width of 1 + total_s / total_n, clustered by row (module docstring), from the sums ``ROW_SUMS``
    of ``key`` ("rs" or "to"); None below two rows with a full chain.

    Example: two rows with S = (2, 4), N = (1, 1): R = 3, sum (S - R N)^2 = 2, var = 2 / 2^2 * 2 = 1 -> 1.96.
    """
    n = rows["rows_n"]
    if n < 2:
        return None
    ratio = total_s / total_n
    spread = rows[f"rows_{key}_ss"] - 2 * ratio * rows[f"rows_{key}_sn"] + ratio ** 2 * rows["rows_nn"]
    return BLOCK_CI_Z * (max(spread, 0.0) * n / (n - 1)) ** 0.5 / total_n


def _block_method(vocab: int, speculate_k: int) -> str:
    exact = vocab ** max(speculate_k - 1, 0) <= block.EXACT_MAX_ATOMS
    return "exact" if exact else f"monte carlo, {block.MC_DRAWS} draft chains per chain"


def _block_sums(draft: torch.Tensor, target: torch.Tensor, temperature: float,
                generator: torch.Generator) -> tuple[float, float]:
    """(sum over chains of E[block accepts], sum of its Monte Carlo variances) for draft/target logits (N, K, V)."""
    if draft.shape[0] == 0:
        return 0.0, 0.0
    if draft.shape[-1] ** max(draft.shape[1] - 1, 0) <= block.EXACT_MAX_ATOMS:
        q = (draft.double() / temperature).softmax(-1)
        p = (target.double() / temperature).softmax(-1)
        return float(block.expected_block_accepts(p, q).sum()), 0.0
    return _sampled_block_sums(draft, target, temperature, generator)


def _sampled_block_sums(draft: torch.Tensor, target: torch.Tensor, temperature: float, generator: torch.Generator,
                        num_draws: int = block.MC_DRAWS) -> tuple[float, float]:
    """``_block_sums`` by Monte Carlo: ``num_draws`` draft chains ŷ_j ~ q_j per chain.

    How it differs from ``block.sampled_block_accepts`` (same estimator, same premise):
    1) ŷ_j is drawn by inverse CDF on q_j's float32 cumulative sums (an error of float32 rounding in each
       token's probability, far below the draws' own noise), so no float64 (N, K, V) softmax exists;
    2) p_j and q_j are read at the drawn tokens only (from float32 logits, p's log-sum-exp and q's cumulative
       sum), and the prefix weights are float64 as in verification.
    The uniforms come from ``generator`` (on the CPU), in chain order.
    """
    n, k, vocab = draft.shape
    q_logits, p_logits = draft.float() / temperature, target.float() / temperature  # (N, K, V)
    q_max, p_lse = q_logits.amax(-1, keepdim=True), p_logits.logsumexp(-1, keepdim=True)  # (N, K, 1)
    cdf = (q_logits - q_max).exp_().cumsum_(-1)  # (N, K, V) unnormalised: q = exp(logit - max) / cdf[..., -1]
    total = cdf[..., -1:].double()  # (N, K, 1)
    uniforms = torch.rand(n, k, num_draws, generator=generator, dtype=torch.float64).to(cdf.device)
    # NOTE: right=True: the first index whose cumulative sum exceeds u, so a zero-probability token is never drawn.
    drafts = torch.searchsorted(cdf, (uniforms * total).to(cdf.dtype), right=True).clamp_max_(vocab - 1)  # (N, K, S)
    p_drawn = (p_logits.gather(-1, drafts) - p_lse).double().exp()  # (N, K, S)
    q_drawn = (q_logits.gather(-1, drafts) - q_max).double().exp() / total
    drawn = [x.transpose(1, 2).reshape(n * num_draws, k, 1) for x in (p_drawn, q_drawn)]  # (N*S, K, 1)
    first = torch.zeros(n * num_draws, k, dtype=torch.long, device=cdf.device)  # each draw's token, now column 0
    weights = block.prefix_weights(drawn[0], first, drawn[1])[:, 1:].sum(1).view(n, num_draws)
    return float(weights.mean(1).sum()), float((weights.var(1) / num_draws).sum())


# NOTE: chains x K x V logits entries evaluated at once: each is held as draft and target logits and as the
# block estimate's float32 cumulative sums (or float64 q and p, for vocabularies small enough to be exact).
EVAL_CHUNK_ELEMENTS = 2**24


def _batch_sums(backbone, head, data: Sequences, rows: range, speculate_k: int, temperature: float, pad_id: int,
                chain_context: str, device: torch.device, num_drafts: tuple[int, ...] = MULTI_DRAFTS) -> dict:
    """One batch's sums over its chains (CPU tensors (K,) and floats): what ``evaluate_mtp`` adds up.

    The chains' lm_head inputs (N, K, D) are made once; their logits only ``EVAL_CHUNK_ELEMENTS`` at a
    time, so no (N, K, V) tensor exists. The block estimate's draws come from one generator seeded by the
    batch's first row, consumed chunk by chunk in order.
    """
    ids, lengths, starts = data.batch(list(rows), pad_id, device)
    draft_states, target_states, mask = chain_states(backbone, head, ids, lengths, starts, speculate_k, chain_context)
    chain_row = chain_starts(ids.shape[1], lengths, starts)[0].cpu()  # (N,)
    lm_head, config = backbone.get_output_embeddings(), backbone.config.get_text_config()
    step = max(1, EVAL_CHUNK_ELEMENTS // (speculate_k * lm_head.weight.shape[0]))  # chains per chunk
    generator = torch.Generator().manual_seed(rows[0])
    sums = {"rs": torch.zeros(speculate_k), "to": torch.zeros(speculate_k), "count": torch.zeros(speculate_k),
            "entropy": 0.0, "num_chains": mask.shape[0], "num_full": 0, "el_rs": 0.0, "el_to": 0.0, "el_block": 0.0,
            "el_block_var": 0.0, **{f"el_multi{n}": 0.0 for n in num_drafts}}
    per_row = torch.zeros(3, len(rows), dtype=torch.float64)  # full chains N_r, summed E[L] RS and TO per row
    for start in range(0, mask.shape[0], step):
        chunk = slice(start, start + step)
        # NOTE: the logits of chain_tensors: the draft's lm_head, the target's after the final soft-cap (if any)
        draft, target = lm_head(draft_states[chunk]), final_logits(config, lm_head(target_states[chunk]))  # (n, K, V)
        alpha_rs, alpha_to, ent = (x.cpu() for x in acceptance_stats(draft, target, temperature=temperature))
        m, full = mask[chunk].float().cpu(), mask[chunk].all(1).cpu()
        block_sum, block_var = _block_sums(draft[full.to(draft.device)], target[full.to(draft.device)], temperature,
                                           generator)
        el_rs, el_to = alpha_rs[full].cumprod(1).sum(1), alpha_to[full].cumprod(1).sum(1)  # (full chains,)
        per_row.index_add_(1, chain_row[chunk][full], torch.stack([torch.ones_like(el_rs), el_rs, el_to]).double())
        p_1, q_1 = ((x[full.to(x.device), 0].float() / temperature).softmax(-1) for x in (target, draft))  # (F, V)
        for n in num_drafts:
            sums[f"el_multi{n}"] += float(multi_draft_expected_accepts(p_1, q_1, alpha_rs[full], n).sum())
        for key, value in (("rs", (alpha_rs * m).sum(0)), ("to", (alpha_to * m).sum(0)), ("count", m.sum(0)),
                           ("entropy", float((ent * m).sum())), ("num_full", int(full.sum())),
                           ("el_rs", float(el_rs.sum())), ("el_to", float(el_to.sum())), ("el_block", block_sum),
                           ("el_block_var", block_var)):
            sums[key] = sums[key] + value
    num, s_rs, s_to = per_row
    sums.update(rows_n=int((num > 0).sum()), rows_nn=float((num * num).sum()), rows_rs_ss=float((s_rs * s_rs).sum()),
                rows_rs_sn=float((s_rs * num).sum()), rows_to_ss=float((s_to * s_to).sum()),
                rows_to_sn=float((s_to * num).sum()))
    return sums


def _interval_cell(result: dict, key: str) -> str:
    """``result[key]`` with its 95% half-width ``key + "_ci95"`` when there is one; "-" for results without it.

    Example: {"accept_length_rs": 2.5, "accept_length_rs_ci95": 0.1234} -> "2.500 ± 0.123".
    """
    if key not in result:
        return "-"
    half = result.get(key + "_ci95")
    return f"{result[key]:.3f}" + (f" ± {half:.3f}" if half else "")


def _multi_cell(result: dict) -> str:
    """"n=2 3.412, n=4 3.501": the accept length with n drafts at depth 1; "-" for results without it."""
    multi = result.get("accept_length_multi") or {}
    return ", ".join(f"n={n} {value:.3f}" for n, value in multi.items()) or "-"


def acceptance_table(results: dict[str, dict]) -> str:
    """Markdown table of eval-mtp results: per-step RS/TO acceptance, accept lengths (with their 95% intervals
    when known) and the rows (sequences) they average.

    Example row: ``| e2e_tv | 0.912 0.871 0.830 | 0.901 0.850 0.805 | 3.366 ± 0.041 | 3.391 | n=2 3.412, n=4 3.501
    | 3.283 ± 0.052 | 0.450 | 256 |``.
    """
    lines = [
        "| head | alpha_RS per step | alpha_TO per step | accept length RS | accept length RS block "
        "| accept length RS, n drafts | accept length TO | H(p) nats | rows |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        rs = " ".join(f"{a:.3f}" for a in r["alpha_rs"])
        to = " ".join(f"{a:.3f}" for a in r["alpha_to"])
        rs_cell, block_cell, to_cell = (_interval_cell(r, f"accept_length_{key}") for key in ("rs", "block", "to"))
        lines.append(f"| {name} | {rs} | {to} | {rs_cell} | {block_cell} | {_multi_cell(r)} | {to_cell} | "
                     f"{r['target_entropy']:.3f} | {r.get('num_rows', '-')} |")
    return "\n".join(lines)
