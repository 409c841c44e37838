"""The engine's draft side: an MTP head chained K steps per verify step over its own ragged KV cache.

``Drafter`` owns the head's ``RaggedKVCache`` and the head's pending input pairs (h_t, x_{t+1}): the
target's state at each position the target has run, with the token emitted after it, that the head
has not read yet. The decode loop (``bebop.speculative.engine``) calls it at five points:

    prefill_feeder   the prefill's chunk callback: the pairs of every prompt position but the last
    push             after the prefill or a plain step: one pair per row, (h at the last position, its token)
    draft            K chained steps from the pending pairs -> drafts (R, K) and their q (R, K, V)
    accept           after a verify step: the pairs of the positions each row kept become pending
    select_rows      finished rows leave the batch, their cache rows and pending pairs with them

One draft call feeds the pending pairs (1 after a plain step, 1..K+1 after a verify step) as step 1,
whose entries are committed (the head's cache holds one entry per committed position); steps 2..K
chain the head on its own output and the previous draft, and their entries are rolled back at the
end of the call, as vLLM and SGLang do.

q is the draft's temperature-scaled softmax, or with ``filter_drafts`` the target's top-k/top-p
applied to the draft's logits (``bebop.speculative.engine``'s deviation 2); drafts are drawn from
exactly that q (``sampling.keyed_race`` on the rows' draft streams), or are its argmax when the
step does not sample (``to`` mode, or temperature 0).
"""

from __future__ import annotations

import torch

from bebop.speculative import rng
from bebop.speculative.kv_cache import RaggedKVCache
from bebop.speculative.multidraft import lane_keys
from bebop.speculative.sampling import keyed_race, logits_to_probs
from bebop.speculative.verification import STREAM_DRAFT


class Drafter:
    """An MTP head drafting for the engine's rows (R of them, row-aligned with the runner's).

    Args:
        head: an ``MtpHead`` on the target.
        batch_size, capacity: rows and positions per row of the head's cache.
        device, dtype: of the cache.
        temperature: the draft temperature (> 0).
        filter_top_k, filter_top_p: the target's top-k/top-p applied to q (``filter_drafts``), or None.
    """

    def __init__(self, head, batch_size: int, capacity: int, device: torch.device, dtype: torch.dtype,
                 temperature: float, filter_top_k: int | None = None, filter_top_p: float | None = None):
        self.head = head
        self.cache = RaggedKVCache(len(head.layers), batch_size, capacity, device, dtype)
        self.temperature = temperature
        self.filter = None if filter_top_k is None else (filter_top_k, filter_top_p)
        self.hidden: torch.Tensor | None = None  # (R, C, D) pending target/head states
        self.tokens: torch.Tensor | None = None  # (R, C) the token emitted after each pending state
        self.count: list[int] = []  # valid pending pairs per row

    def prefill_feeder(self, ids: torch.Tensor, lengths: list[int]):
        """The prefill's chunk callback (``Target.prefill``'s ``each_chunk``): feeds the head its input pairs
        (h_t, x_{t+1}) for every prompt position t but the last (whose x_{t+1} is the first sampled token).

        Args:
            ids: (B, W) the right-padded prompts, rows ordered longest first.
            lengths: the prompts' lengths (host ints).
        """
        cache, head, device = self.cache, self.head, ids.device
        padded = torch.nn.functional.pad(ids, (0, 1))  # (B, W + 1): x_{t+1} for t = W - 1 is padding

        def feed(start: int, hidden: torch.Tensor) -> None:  # hidden (R, S, D) at positions start ..
            num_rows, width = hidden.shape[:2]
            counts = [max(0, min(width, n - 1 - start)) for n in lengths[:num_rows]]
            positions = cache.begin(width, num_rows)
            valid = torch.arange(width, device=device)[None, :] < torch.tensor(counts, device=device)[:, None]
            head.forward_step(hidden, padded[:num_rows, start + 1: start + 1 + width], positions, step=0,
                              attention_bias=cache.attention_bias(valid), cache=cache)
            cache.commit(counts + [0] * (len(lengths) - num_rows))

        return feed

    def push(self, hidden: torch.Tensor, token: torch.Tensor) -> None:
        """Appends one pair (hidden (R, D), token (R,)) to each row's pending pairs."""
        if self.hidden is None:
            self.hidden, self.tokens, self.count = hidden[:, None], token[:, None], [1] * token.shape[0]
            return
        count = torch.tensor(self.count, device=token.device)
        grow = max(self.count) + 1 - self.tokens.shape[1]
        if grow > 0:
            self.hidden = torch.nn.functional.pad(self.hidden, (0, 0, 0, grow))
            self.tokens = torch.nn.functional.pad(self.tokens, (0, grow))
        arange = torch.arange(len(self.count), device=token.device)
        self.hidden[arange, count] = hidden.to(self.hidden.dtype)
        self.tokens[arange, count] = token
        self.count = [c + 1 for c in self.count]

    def accept(self, hidden: torch.Tensor, tokens: torch.Tensor, num_kept: list[int]) -> None:
        """After a verify step: hidden (R, K+1, D) at each fed position, tokens (R, K+1) emitted after each
        (PAD past a row's kept ones), num_kept (R,) host ints; the kept pairs become the pending ones."""
        self.hidden, self.tokens, self.count = hidden, tokens.clamp_min(0), num_kept

    def draft(self, rows, k: int, sampled: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """K chained head steps from the pending pairs -> drafts (R, K) and the draft distributions q (R, K, V).

        Args:
            rows: the runner's rows (``keys`` (R, 2 + max K) and ``counters`` (R,): their draft noise).
            k: K >= 1, draft steps.
            sampled: draw drafts from q (``rs`` at temperature > 0); else each draft is argmax q.
        """
        cache, head = self.cache, self.head
        g = self._feed_pending()  # (R, D)
        # every draft step of a block draws at the block's counter, from its own stream
        keys = rng.counter_keys(rows.keys[:, STREAM_DRAFT: STREAM_DRAFT + k], rows.counters) if sampled else None
        tokens, probs = [], []
        for j in range(k):
            if j > 0:
                g = self._chained_step(g, tokens[-1], j)
            logits = head.logits(g, step=j)
            q = self.probs(logits)
            tokens.append(keyed_race(q, keys[:, j]) if sampled else logits.argmax(-1))
            probs.append(q)
        if k > 1:
            cache.rollback(k - 1)  # the chained steps' entries were speculative
        return torch.stack(tokens, 1), torch.stack(probs, 1)

    def draft_lanes(self, rows, k: int, num_drafts: int) -> tuple[torch.Tensor, torch.Tensor]:
        """n chains per row (``bebop.speculative.multidraft``): n first drafts drawn i.i.d. from q_1, each
        continued K - 1 chained steps -> drafts (R, n, K) and q (R, n, K, V). Drafts are always sampled.

        The chained steps run on n copies of each row's cache (one lane per chain); the copies are dropped
        after the call. Lane 0 draws from the rows' draft streams, so n = 1 drafts exactly what ``draft``
        draws; lane c > 0 from streams derived from them (``multidraft.lane_keys``).
        """
        cache, head = self.cache, self.head
        g = self._feed_pending()  # (R, D)
        q_first = self.probs(head.logits(g, step=0))  # (R, V)
        num, vocab = q_first.shape
        keys = lane_keys(rows.keys, rows.counters, k, num_drafts).reshape(num * num_drafts, k)  # lane r * n + c
        cache.select_rows([r for r in range(num) for _ in range(num_drafts)])
        g = g.repeat_interleave(num_drafts, dim=0)  # (R n, D)
        probs = [q_first.repeat_interleave(num_drafts, dim=0)]
        tokens = [keyed_race(probs[0], keys[:, 0])]  # n i.i.d. first drafts per row
        for j in range(1, k):
            g = self._chained_step(g, tokens[-1], j)
            probs.append(self.probs(head.logits(g, step=j)))
            tokens.append(keyed_race(probs[-1], keys[:, j]))
        if k > 1:
            cache.rollback(k - 1)
        cache.select_rows(list(range(0, num * num_drafts, num_drafts)))  # every lane's committed part is the row's
        return (torch.stack(tokens, 1).view(num, num_drafts, k),
                torch.stack(probs, 1).view(num, num_drafts, k, vocab))

    def _chained_step(self, g: torch.Tensor, token: torch.Tensor, step: int) -> torch.Tensor:  # (R, D)
        """Draft step ``step`` >= 1 from the previous step's output g (R, D) and draft token (R,); its cache entry is
        speculative (``draft`` and ``draft_lanes`` roll them back)."""
        positions = self.cache.begin(1)
        g = self.head.forward_step(g[:, None], token[:, None], positions, step=step,
                                   attention_bias=self.cache.attention_bias(), cache=self.cache)[:, 0]
        self.cache.shift_all(1)
        return g

    def _feed_pending(self) -> torch.Tensor:  # (R, D)
        """Step 1 over the pending pairs, committed to the head's cache -> the head's output at each row's frontier."""
        cache = self.cache
        count = torch.tensor(self.count, device=self.tokens.device)
        width = self.tokens.shape[1]
        positions = cache.begin(width)
        valid = torch.arange(width, device=count.device)[None, :] < count[:, None]
        g = self.head.forward_step(self.hidden, self.tokens, positions, step=0,
                                   attention_bias=cache.attention_bias(valid), cache=cache)
        cache.commit(self.count)
        return g[torch.arange(len(self.count), device=count.device), count - 1]  # output at the frontier pair

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """q (R, V) from draft logits (R, V): the draft temperature, then (``filter_drafts``) the target's
        top-k/top-p."""
        if self.filter is not None:
            return logits_to_probs(logits, self.temperature, *self.filter)
        return torch.softmax(logits.float() / self.temperature, dim=-1)

    def select_rows(self, keep: list[int]) -> None:
        """Keeps only rows ``keep`` (in that order): their cache rows and pending pairs."""
        self.cache.select_rows(keep)
        if self.hidden is not None:
            idx = torch.tensor(keep, dtype=torch.long, device=self.tokens.device)
            self.hidden, self.tokens = self.hidden[idx], self.tokens[idx]
            self.count = [self.count[i] for i in keep]
