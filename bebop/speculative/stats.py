"""Speculative-decoding statistics (``SpecStats``), with vLLM's metric names plus ours.

Per verify step: drafts proposed, accepted, and the accept-length histogram. Per draft position
of every verify step: the target entropy H(p_j) and the *counterfactual* acceptance of both
rules on the same rollout, alpha_RS = sum_v min(p_j, q_j) and alpha_TO = p_j(argmax q_j),
whichever mode actually ran, so any rollout can be plotted as acceptance against entropy.

Only emitted tokens count. The engine logs each step's tokens in an ``EmissionLog`` before it
knows where a completion ends (EOS, ``max_new_tokens`` or a stop string, which may cut tokens
emitted one step earlier); ``EmissionLog.to_stats`` then keeps exactly the tokens the completions
kept:

1. A verify step whose block of e = 1 + n tokens (n drafts accepted, then the recovered or bonus
   token) is cut to e' < e kept tokens counts as a step that accepted e' - 1 drafts, so accept
   length stays "tokens emitted per verify step". A step none of whose tokens was kept does not
   count at all.
2. Draft position j of a step is recorded (entropy, alpha_RS, alpha_TO) only when the j-th token of
   the step's block was kept: positions after a rejected draft were verified against a context
   that no completion contains, and positions past the end of a completion belong to no
   completion.
3. ``token_entropy`` holds H(p) of the distribution every kept token was drawn from (the prefill
   token included), in every mode, so modes ``none``, ``to`` and ``rs`` average over the same
   positions: one per completion token.

vLLM's counters (``num_accepted_tokens``, ``num_accepted_tokens_per_pos``) differ: they are
updated from the verifier's output *before* the stop check, so drafts accepted after an EOS, past
``max_tokens`` or after a stop string are counted although the request drops them, which biases
accept length upward at short completions. ``SpecStats`` holds both conventions under distinct
metric keys (docs/vllm.md), so runs of either backend compare on either:

- ``spec/num_drafts``, ``spec/num_accepted_tokens``, ``spec/accepted_per_pos``, ``spec/accept_length``:
  emitted tokens only (the rules above).
- ``spec/verifier_num_drafts``, ``spec/verifier_num_accepted_tokens``, ``spec/verifier_accepted_per_pos``,
  ``spec/verifier_accept_length``: every verify step as the verifier emitted it, before the stop
  check (vLLM's counting).
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field

import numpy as np
import torch

ENTROPY_BLOCK_ELEMENTS = 1 << 18  # values `entropy` reads at once: its temporaries stay in a core's cache


@dataclass
class SpecStats:
    """Accumulated over one ``generate`` call (or merged over several with ``merge``); emitted tokens only."""

    speculate_k: int = 0  # K; 0 for plain decoding
    num_drafts: int = 0  # verify steps that emitted at least one kept token
    num_draft_tokens: int = 0  # drafts proposed in those steps (num_drafts * K, or the sum of each step's K)
    num_accepted_tokens: int = 0  # kept tokens per step minus one, summed (see the module docstring)
    accepted_per_pos: list[int] = field(default_factory=list)  # (K,) steps that kept their draft at position j
    accept_length_hist: list[int] = field(default_factory=list)  # (K+1,) verify steps keeping 1..K+1 tokens
    num_generated_tokens: int = 0  # tokens emitted to completions (after EOS/length/stop truncation)
    # The same counts before the stop check (every verify step in full: vLLM's counting).
    verifier_num_drafts: int = 0  # verify steps
    verifier_num_accepted_tokens: int = 0  # drafts the verifier accepted in them
    verifier_accepted_per_pos: list[int] = field(default_factory=list)  # (K,) steps accepting the draft at position j
    # Per kept draft position of every verify step, flattened; kept on the CPU.
    draft_position: list[torch.Tensor] = field(default_factory=list)  # (M,) j = 1..K
    draft_row: list[torch.Tensor] = field(default_factory=list)  # (M,) the completion (row of generate) it belongs to
    draft_entropy: list[torch.Tensor] = field(default_factory=list)  # (M,) H(p_j) in nats
    alpha_rs: list[torch.Tensor] = field(default_factory=list)  # (M,) sum min(p_j, q_j)
    alpha_to: list[torch.Tensor] = field(default_factory=list)  # (M,) p_j(argmax q_j)
    # Per kept token (every mode): entropy of the target distribution it was drawn from.
    token_entropy: list[torch.Tensor] = field(default_factory=list)  # (N,)

    def __post_init__(self) -> None:
        if not self.accepted_per_pos:
            self.accepted_per_pos = [0] * self.speculate_k
        if not self.accept_length_hist:
            self.accept_length_hist = [0] * (self.speculate_k + 1)
        if not self.verifier_accepted_per_pos:
            self.verifier_accepted_per_pos = [0] * self.speculate_k

    def record_positions(self, position: torch.Tensor, row: torch.Tensor, entropy: torch.Tensor,
                         alpha_rs: torch.Tensor, alpha_to: torch.Tensor) -> None:
        """Adds kept draft positions, each argument (M,)."""
        self.draft_position.append(position.reshape(-1).long().cpu())
        self.draft_row.append(row.reshape(-1).long().cpu())
        self.draft_entropy.append(entropy.reshape(-1).float().cpu())
        self.alpha_rs.append(alpha_rs.reshape(-1).float().cpu())
        self.alpha_to.append(alpha_to.reshape(-1).float().cpu())

    def record_token_entropy(self, entropy: torch.Tensor) -> None:
        self.token_entropy.append(entropy.reshape(-1).float().cpu())

    @property
    def accept_length(self) -> float:
        """1 + accepted / drafts (vLLM's convention): kept tokens per verify step."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else float("nan")

    @property
    def verifier_accept_length(self) -> float:
        """1 + accepted / drafts before the stop check: tokens the verifier emitted per verify step."""
        return 1.0 + self.verifier_num_accepted_tokens / self.verifier_num_drafts if self.verifier_num_drafts \
            else float("nan")

    @property
    def mean_target_entropy(self) -> float:
        t = _cat(self.token_entropy)
        return float(t.mean()) if t.numel() else float("nan")

    def per_position_means(self) -> dict[str, list[float]]:
        """Mean alpha_RS, alpha_TO and H(p) at each draft position j = 1..K."""
        pos, ent, rs, to = (_cat(x) for x in (self.draft_position, self.draft_entropy, self.alpha_rs, self.alpha_to))
        out: dict[str, list[float]] = {"alpha_rs": [], "alpha_to": [], "entropy": []}
        for j in range(1, self.speculate_k + 1):
            sel = pos == j
            for key, values in (("alpha_rs", rs), ("alpha_to", to), ("entropy", ent)):
                out[key].append(float(values[sel].mean()) if sel.any() else float("nan"))
        return out

    def token_arrays(self) -> dict[str, torch.Tensor]:
        """Flattened per-position arrays: position, row, entropy, alpha_rs, alpha_to (for fits and plots)."""
        return {
            "position": _cat(self.draft_position),
            "row": _cat(self.draft_row),
            "entropy": _cat(self.draft_entropy),
            "alpha_rs": _cat(self.alpha_rs),
            "alpha_to": _cat(self.alpha_to),
        }

    def to_metrics(self) -> dict[str, float | int | list[float]]:
        """Namespaced metrics (``spec/...``), as logged by ``bebop generate`` and ``bebop rl``."""
        per_pos = self.per_position_means()
        drafts = max(self.num_drafts, 1)
        return {
            "spec/num_drafts": self.num_drafts,
            "spec/num_draft_tokens": self.num_draft_tokens,
            "spec/num_accepted_tokens": self.num_accepted_tokens,
            "spec/accepted_per_pos": [a / drafts for a in self.accepted_per_pos],
            "spec/accept_length": self.accept_length,
            "spec/accept_length_hist": list(self.accept_length_hist),
            "spec/alpha_rs": per_pos["alpha_rs"],
            "spec/alpha_to": per_pos["alpha_to"],
            "spec/target_entropy": self.mean_target_entropy,
            "spec/num_generated_tokens": self.num_generated_tokens,
            "spec/verifier_num_drafts": self.verifier_num_drafts,
            "spec/verifier_num_accepted_tokens": self.verifier_num_accepted_tokens,
            "spec/verifier_accepted_per_pos": [a / max(self.verifier_num_drafts, 1)
                                               for a in self.verifier_accepted_per_pos],
            "spec/verifier_accept_length": self.verifier_accept_length,
        }

    def merge(self, other: SpecStats) -> SpecStats:
        """Adds ``other``'s counts and arrays into this object (same K) and returns it."""
        if other.speculate_k != self.speculate_k:
            raise ValueError(f"cannot merge stats with K={other.speculate_k} into K={self.speculate_k}")
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        self.num_generated_tokens += other.num_generated_tokens
        self.accepted_per_pos = [a + b for a, b in zip(self.accepted_per_pos, other.accepted_per_pos)]
        self.accept_length_hist = [a + b for a, b in zip(self.accept_length_hist, other.accept_length_hist)]
        self.verifier_num_drafts += other.verifier_num_drafts
        self.verifier_num_accepted_tokens += other.verifier_num_accepted_tokens
        self.verifier_accepted_per_pos = [a + b for a, b in zip(self.verifier_accepted_per_pos,
                                                                other.verifier_accepted_per_pos)]
        for name in ("draft_position", "draft_row", "draft_entropy", "alpha_rs", "alpha_to", "token_entropy"):
            getattr(self, name).extend(getattr(other, name))
        return self


def concat_stats(parts: list[SpecStats], num_rows: list[int]) -> SpecStats:
    """The statistics of several calls whose rows are laid end to end (processes in rank order): counts
    summed, each part's ``draft_row`` shifted past the ``num_rows`` of the parts before it. The parts are
    not changed.

    Example: parts of 4 and 2 rows, a position of row 1 in the second -> row 5 of the result.
    """
    out, offset = SpecStats(speculate_k=parts[0].speculate_k), 0
    for part, rows in zip(parts, num_rows, strict=True):
        shifted = dataclasses.replace(part, draft_row=[r + offset for r in part.draft_row])
        out.merge(shifted)
        offset += rows
    return out


@dataclass
class _Block:
    """One prefill, plain or verify step of the active rows, before the completions' ends are known."""

    rows: list[int]  # (R,) original row of each active row
    starts: list[int]  # (R,) completion index of the row's first token in this block
    widths: list[int]  # (R,) tokens the step emitted per row, before truncation
    token_entropy: torch.Tensor  # (R, W) H(p) of the distribution of each block token
    drafts: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None  # verify steps: (R, K) H(p_j), alpha_RS, alpha_TO


class EmissionLog:
    """Per-step records of a ``generate`` call; ``to_stats`` keeps the tokens the completions kept.

    Example: a row whose verify step emitted [d1, d2, bonus] with d1 = EOS keeps one token: the step
    counts as accept length 1 and only draft position 1 is recorded.
    """

    def __init__(self, speculate_k: int):
        self.k = speculate_k
        self.blocks: list[_Block] = []
        self._kept: tuple | None = None  # (lengths, ``kept``'s answer), until the next block

    def add_block(self, rows: list[int], starts: list[int], widths: list[int], token_entropy: torch.Tensor,
                  drafts: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> None:
        """Logs one step. ``token_entropy`` (R, W) and ``drafts`` (R, K) each stay on their device."""
        self.blocks.append(_Block(list(rows), list(starts), list(widths), token_entropy.detach(),
                                  None if drafts is None else tuple(d.detach() for d in drafts)))
        self._kept = None

    def kept(self, lengths: list[int]) -> KeptTokens:
        """The kept tokens and draft positions of every step, given each completion's final length
        (host ints), flattened over blocks in order, rows in order, tokens / depths in order; from a
        GPU, one transfer per kind of value (entropies, then each draft value), not one per step.
        The last answer is kept until the next block: ``to_stats`` and ``bebop.speculative.auto.acceptance`` ask for
        the same lengths."""
        key = tuple(lengths)
        if self._kept is not None and self._kept[0] == key:
            return self._kept[1]
        blocks = self.blocks
        rows, starts, widths = (np.array(list(itertools.chain.from_iterable(getattr(b, name) for b in blocks)),
                                         dtype=np.int64) for name in ("rows", "starts", "widths"))
        kept = np.clip(np.minimum(widths, np.asarray(lengths, dtype=np.int64)[rows] - starts), 0, None)  # (sum R,)
        size = [len(b.rows) for b in blocks]
        # Token entropies: each row's W block tokens, the first ``kept`` of them kept.
        span = np.repeat([b.token_entropy.shape[1] for b in blocks], size)  # (sum R,) W
        token_entropy = _host([b.token_entropy for b in blocks])[_first(span, kept)]
        token_row = np.repeat(rows, kept)
        token_offset = np.repeat(starts, kept) + np.arange(len(token_row)) - np.repeat(np.cumsum(kept) - kept, kept)
        # Draft positions of the verify steps: depth j of a row is kept when the step kept >= j tokens.
        drafted = np.repeat([b.drafts is not None for b in blocks], size)
        steps = [b for b in blocks if b.drafts is not None]
        k = np.repeat([b.drafts[0].shape[1] for b in steps], [len(b.rows) for b in steps]).astype(np.int64)  # (V,)
        step_kept = kept[drafted]
        mask = _first(k, step_kept)  # (sum R K,)
        values = np.stack([_host([b.drafts[i] for b in steps]) for i in range(3)])[:, mask]  # (3, M)
        depth = (np.arange(len(mask)) - np.repeat(np.cumsum(k) - k, k) + 1)[mask]
        result = KeptTokens(
            token_entropy=token_entropy, token_row=token_row, token_offset=token_offset, step_k=k,
            step_kept=step_kept, depth=depth,
            row=np.repeat(rows[drafted], k)[mask], offset=np.repeat(starts[drafted], k)[mask],
            k=np.repeat(k, k)[mask], accepted=depth < np.repeat(step_kept, k)[mask], values=values)
        self._kept = (key, result)
        return result

    def to_stats(self, lengths: list[int]) -> SpecStats:
        """The statistics of the kept tokens, given each completion's final length (host ints)."""
        stats = SpecStats(speculate_k=self.k)
        stats.num_generated_tokens = sum(lengths)
        if not self.blocks:
            return stats
        kept = self.kept(lengths)
        stats.record_token_entropy(torch.tensor(kept.token_entropy))  # NOTE: copies: ``kept``'s answer is kept
        counted = kept.step_kept > 0  # a step none of whose tokens was kept does not count
        accepted = kept.step_kept[counted] - 1
        stats.num_drafts = int(counted.sum())
        stats.num_draft_tokens = int(kept.step_k[counted].sum())
        stats.num_accepted_tokens = int(accepted.sum())
        stats.accept_length_hist = np.bincount(accepted, minlength=self.k + 1).tolist()
        stats.accepted_per_pos = [int((accepted > j).sum()) for j in range(self.k)]
        if len(kept.depth):
            stats.record_positions(*(torch.tensor(a) for a in (kept.depth, kept.row, *kept.values)))
        self._count_verifier(stats)
        return stats

    def _count_verifier(self, stats: SpecStats) -> None:
        """Fills ``stats.verifier_*``: every verify step of every row in full (widths before any cut)."""
        accepted = np.array([w - 1 for b in self.blocks if b.drafts is not None for w in b.widths], dtype=np.int64)
        stats.verifier_num_drafts = len(accepted)
        stats.verifier_num_accepted_tokens = int(accepted.sum())
        stats.verifier_accepted_per_pos = [int((accepted > j).sum()) for j in range(self.k)]


@dataclass
class KeptTokens:
    """``EmissionLog.kept``: what the completions kept of a call's steps, flat, on the host."""

    token_entropy: np.ndarray  # (N,) H(p) of every kept token
    token_row: np.ndarray  # (N,) its row of ``generate``
    token_offset: np.ndarray  # (N,) its offset in the completion (tokens its row emitted before it)
    step_k: np.ndarray  # (V,) each verify step row's K
    step_kept: np.ndarray  # (V,) tokens it kept (0: none)
    depth: np.ndarray  # (M,) each kept draft position's depth, 1-based
    row: np.ndarray  # (M,) its row of ``generate``
    offset: np.ndarray  # (M,) tokens its row had emitted before the step
    k: np.ndarray  # (M,) its step's K
    accepted: np.ndarray  # (M,) the draft was accepted (a token follows it)
    values: np.ndarray  # (3, M) H(p_j), alpha_RS, alpha_TO (float32)


def _host(parts: list[torch.Tensor]) -> np.ndarray:
    """``parts`` flattened and laid end to end on the host, float32 (one transfer from a GPU)."""
    if not parts:
        return np.zeros(0, dtype=np.float32)
    if parts[0].device.type == "cpu":  # NOTE: numpy views: a torch op per part costs more than the copy
        return np.concatenate([p.reshape(-1).float().numpy() for p in parts])
    return torch.cat([p.reshape(-1).float() for p in parts]).cpu().numpy()


def _first(span: np.ndarray, count: np.ndarray) -> np.ndarray:
    """(sum span,) bool over rows of ``span[i]`` slots laid end to end: a row's first ``count[i]`` slots."""
    within = np.arange(int(span.sum())) - np.repeat(np.cumsum(span) - span, span)
    return within < np.repeat(count, span)


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(parts) if parts else torch.empty(0)


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """H(p) in nats over the last dim, with 0 log 0 = 0.

    Rows go a block at a time (about ENTROPY_BLOCK_ELEMENTS values): each row is the same reduction as
    over the whole tensor, while the clamp, log and product temporaries stay in a core's cache instead of
    three (..., V) copies; at V = 151,936 and 64 rows, a fifth of the time on one CPU thread (docs/scaling.md).
    """
    flat = probs.reshape(-1, probs.shape[-1])
    rows = max(1, ENTROPY_BLOCK_ELEMENTS // max(flat.shape[-1], 1))
    if flat.shape[0] <= rows:
        return _entropy(probs)
    return torch.cat([_entropy(flat[start: start + rows]) for start in range(0, flat.shape[0], rows)]).view(
        probs.shape[:-1])


def _entropy(probs: torch.Tensor) -> torch.Tensor:
    return -(probs * torch.log(probs.clamp_min(1e-30))).sum(-1)
