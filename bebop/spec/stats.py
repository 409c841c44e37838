"""Speculative-decoding statistics (``SpecStats``), with vLLM's metric names plus ours.

Per verify step: drafts proposed, accepted, and the accept-length histogram. Per draft position
of every verify step: the target entropy H(p_j) and the *counterfactual* acceptance of both
rules on the same rollout, alpha_RS = sum_v min(p_j, q_j) and alpha_TO = p_j(argmax q_j),
whichever mode actually ran, so any rollout can be plotted as acceptance against entropy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class SpecStats:
    """Accumulated over one ``generate`` call (or merged over several with ``merge``)."""

    speculate_k: int = 0  # K; 0 for plain decoding
    num_drafts: int = 0  # verify steps that carried drafts
    num_draft_tokens: int = 0  # drafts proposed (num_drafts * K)
    num_accepted_tokens: int = 0  # drafts accepted
    accepted_per_pos: list[int] = field(default_factory=list)  # (K,) drafts accepted at position j
    accept_length_hist: list[int] = field(default_factory=list)  # (K+1,) verify steps emitting 1..K+1 tokens
    num_generated_tokens: int = 0  # tokens emitted to completions (after EOS/length truncation)
    # Per draft position of every verify step, flattened; kept on the CPU.
    draft_position: list[torch.Tensor] = field(default_factory=list)  # (M,) j = 1..K
    draft_entropy: list[torch.Tensor] = field(default_factory=list)  # (M,) H(p_j) in nats
    alpha_rs: list[torch.Tensor] = field(default_factory=list)  # (M,) sum min(p_j, q_j)
    alpha_to: list[torch.Tensor] = field(default_factory=list)  # (M,) p_j(argmax q_j)
    # Per generated token (every mode): entropy of the target distribution it was drawn from.
    token_entropy: list[torch.Tensor] = field(default_factory=list)  # (N,)

    def __post_init__(self) -> None:
        if not self.accepted_per_pos:
            self.accepted_per_pos = [0] * self.speculate_k
        if not self.accept_length_hist:
            self.accept_length_hist = [0] * (self.speculate_k + 1)

    def record_verify(self, num_accepted: list[int]) -> None:
        """Counts one verify step for each row (``num_accepted`` already on the host)."""
        k = self.speculate_k
        self.num_drafts += len(num_accepted)
        self.num_draft_tokens += k * len(num_accepted)
        for n in num_accepted:
            self.num_accepted_tokens += n
            self.accept_length_hist[n] += 1
            for j in range(n):
                self.accepted_per_pos[j] += 1

    def record_positions(self, entropy: torch.Tensor, alpha_rs: torch.Tensor, alpha_to: torch.Tensor) -> None:
        """Adds per-position values, each (B, K)."""
        k = entropy.shape[1]
        self.draft_position.append(torch.arange(1, k + 1).repeat(entropy.shape[0]))
        self.draft_entropy.append(entropy.reshape(-1).float().cpu())
        self.alpha_rs.append(alpha_rs.reshape(-1).float().cpu())
        self.alpha_to.append(alpha_to.reshape(-1).float().cpu())

    def record_token_entropy(self, entropy: torch.Tensor) -> None:
        self.token_entropy.append(entropy.reshape(-1).float().cpu())

    @property
    def accept_length(self) -> float:
        """1 + accepted / drafts (vLLM's convention): tokens emitted per verify step."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else float("nan")

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
        """Flattened per-position arrays: position, entropy, alpha_rs, alpha_to (for fits and plots)."""
        return {
            "position": _cat(self.draft_position),
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
        for name in ("draft_position", "draft_entropy", "alpha_rs", "alpha_to", "token_entropy"):
            getattr(self, name).extend(getattr(other, name))
        return self


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(parts) if parts else torch.empty(0)


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """H(p) in nats over the last dim, with 0 log 0 = 0."""
    return -(probs * torch.log(probs.clamp_min(1e-30))).sum(-1)
