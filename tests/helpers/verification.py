"""Verification test helpers shared by the token-wise and block verifiers' tests: awkward (p, q) pairs,
a chain's exact target and emitted joints, the crafted-coin check, and the statistical tables and
chi-square p-values over JOINT_VOCAB^3 three-token joints."""

import itertools
import math

import numpy as np
import scipy.stats
import torch

from bebop.speculative.sampling import PAD_TOKEN_ID

ALPHA = 1e-4  # false-alarm odds per chi-square check
NUM_ROWS = 100_000  # rows per statistical test, drawn as one batch
EXACT_ATOL = 1e-6  # closed-form distributions must match to this

# ----------------------------------------------------------------------------- closed form

AWKWARD = {  # name -> (p, q) over V = 4
    "p_has_zeros": ([0.5, 0.5, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]),
    "q_has_zeros": ([0.25, 0.25, 0.25, 0.25], [0.7, 0.3, 0.0, 0.0]),
    "one_hot_p": ([0.0, 0.0, 1.0, 0.0], [0.1, 0.2, 0.3, 0.4]),
    "one_hot_q": ([0.3, 0.3, 0.2, 0.2], [1.0, 0.0, 0.0, 0.0]),
    "uniform": ([0.25, 0.25, 0.25, 0.25], [0.25, 0.25, 0.25, 0.25]),
    "disjoint": ([0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.6, 0.4]),
    "p_equals_q": ([0.1, 0.2, 0.3, 0.4], [0.1, 0.2, 0.3, 0.4]),
    "same_one_hot": ([0.0, 1.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]),
    "other_one_hot": ([0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]),
}


def random_pairs(vocab: int, count: int, seed: int) -> list:
    """Dirichlet pairs with about a third of the entries zeroed (each row keeps some mass)."""
    gen = np.random.default_rng(seed)
    pairs = []
    for _ in range(count):
        pq = gen.dirichlet(np.ones(vocab), size=2) * (gen.random((2, vocab)) > 0.33)
        pq[:, gen.integers(vocab)] += 0.05
        pairs.append(tuple((pq / pq.sum(1, keepdims=True)).tolist()))
    return pairs


class Chain:
    """A target P and draft Q that depend on the prefix: step 1 is the given pair; later steps pick
    pairs from a pool by a hash of the prefix, so p_2 = P2[ŷ_1] changes with the first token."""

    def __init__(self, first_pair, pool):
        self.first, self.pool = first_pair, pool

    def pair(self, prefix: tuple) -> tuple:
        if not prefix:
            return self.first
        index = sum((i + 2) * (t + 1) for i, t in enumerate(prefix)) + 5 * len(prefix)
        return self.pool[index % len(self.pool)]

    def p(self, prefix):
        return np.array(self.pair(prefix)[0])

    def q(self, prefix):
        return np.array(self.pair(prefix)[1])


def target_joint(chain: Chain, vocab: int, length: int) -> np.ndarray:
    """P(s) = Π_t P(s[:t])[s[t]] over all sequences of `length` tokens."""
    joint = np.zeros((vocab,) * length)
    for seq in itertools.product(range(vocab), repeat=length):
        joint[seq] = math.prod(chain.p(seq[:t])[seq[t]] for t in range(length))
    return joint


def emitted_joint(chain, drafts, accept, resample, vocab) -> np.ndarray:
    """Distribution of the first K+1 emitted tokens for one fixed draft sequence: the block stops at
    n with probability Π_{i<n} a_i · (1 - a_n) (or Π a_i at n = K), emits drafts[:n] then a token
    from resample[n]; afterwards decoding continues with plain draws from the target."""
    k = len(drafts)
    joint = np.zeros((vocab,) * (k + 1))
    for seq in itertools.product(range(vocab), repeat=k + 1):
        total, reach = 0.0, 1.0
        for n in range(k + 1):
            if tuple(seq[:n]) != tuple(drafts[:n]):
                break
            stop = reach * ((1 - accept[n]) if n < k else 1.0)
            tail = math.prod(chain.p(seq[:t])[seq[t]] for t in range(n + 1, k + 1))
            total += stop * resample[n][seq[n]] * tail
            if n < k:
                reach *= accept[n]
        joint[seq] = total
    return joint


def block_inputs(chain: Chain, vocab: int, k: int, dtype=torch.float64):
    """Every draft sequence as one row: target rows P(ŷ[:j]) (j = 0..K), draft rows Q(ŷ[:j])."""
    drafts = list(itertools.product(range(vocab), repeat=k))
    target = np.array([[chain.p(d[:j]) for j in range(k + 1)] for d in drafts])  # (B, K+1, V)
    draft_probs = np.array([[chain.q(d[:j]) for j in range(k)] for d in drafts])  # (B, K, V)
    weights = [math.prod(chain.q(d[:j])[d[j]] for j in range(k)) for d in drafts]
    draft_tokens = torch.tensor(drafts, dtype=torch.int64).view(len(drafts), k)  # (B, K)
    return (drafts, torch.tensor(target, dtype=dtype), draft_tokens,
            torch.tensor(draft_probs, dtype=dtype), weights)


CASES = [(name, pair, 4) for name, pair in AWKWARD.items()]
CASES += [(f"random_v{v}_{i}", pair, v) for v in (3, 5) for i, pair in enumerate(random_pairs(v, 3, seed=v))]


def chain_for(pair, vocab):
    pool = list(AWKWARD.values()) if vocab == 4 else random_pairs(vocab, 6, seed=100 + vocab)
    return Chain(pair, pool)


# ----------------------------------------------------------------------------- statistical

JOINT_VOCAB = 5  # small enough that the V^3 = 125 cells of the 3-token joint hold ~800 samples each


def sample_tables(seed: int):
    """Target P1, P2[a], P3[a, b] and draft Q1, Q2[a] with zeros on either side (float32)."""
    gen = np.random.default_rng(seed)

    def rand(*shape):
        x = gen.dirichlet(np.ones(JOINT_VOCAB), size=shape) * (gen.random(shape + (JOINT_VOCAB,)) > 0.25)
        x[..., 0] += 0.02  # keep every row non-empty
        return torch.tensor(x / x.sum(-1, keepdims=True), dtype=torch.float32)

    return rand(), rand(JOINT_VOCAB), rand(JOINT_VOCAB, JOINT_VOCAB), rand(), rand(JOINT_VOCAB)


def continue_plain(output, num_accepted, p2, p3, gen):
    """Complete each row to 3 tokens: after the block stops, draw from the target as plain decoding would."""
    seq = output.clone()
    plain_2 = torch.multinomial(p2[seq[:, 0]], 1, generator=gen).squeeze(1)
    seq[:, 1] = torch.where(num_accepted >= 1, output[:, 1], plain_2)
    plain_3 = torch.multinomial(p3[seq[:, 0], seq[:, 1]], 1, generator=gen).squeeze(1)
    seq[:, 2] = torch.where(num_accepted >= 2, output[:, 2], plain_3)
    return seq


def chi_square_pvalues(seq, p1, p2, p3) -> list:
    """p-values for the first token, the first two, and all three, against the target's joint."""
    joint = (p1[:, None, None] * p2[:, :, None] * p3).double()  # (V, V, V)
    counts = torch.bincount(seq[:, 0] * JOINT_VOCAB**2 + seq[:, 1] * JOINT_VOCAB + seq[:, 2], minlength=JOINT_VOCAB**3)
    counts = counts.view(JOINT_VOCAB, JOINT_VOCAB, JOINT_VOCAB).double()
    pvalues = []
    for dims in ((1, 2), (2,), ()):
        observed = counts.sum(dims) if dims else counts
        expected = joint.sum(dims) if dims else joint
        expected = expected / expected.sum() * seq.shape[0]
        support = expected > 0
        assert observed[~support].sum() == 0, "a token the target gives probability 0 was emitted"
        pvalues.append(scipy.stats.chisquare(observed[support].numpy(), expected[support].numpy()).pvalue)
    return pvalues


def rs_rows(tables, gen):
    p1, p2, p3, q1, q2 = tables
    y1 = torch.multinomial(q1, NUM_ROWS, replacement=True, generator=gen)
    y2 = torch.multinomial(q2[y1], 1, generator=gen).squeeze(1)
    target = torch.stack([p1.expand(NUM_ROWS, JOINT_VOCAB), p2[y1], p3[y1, y2]], dim=1)  # (N, 3, V)
    draft_probs = torch.stack([q1.expand(NUM_ROWS, JOINT_VOCAB), q2[y1]], dim=1)  # (N, 2, V)
    return target, torch.stack([y1, y2], dim=1), draft_probs


def assert_stops_at(
    stop: int,
    output: torch.Tensor,  # (B, K+1) a verify op's tokens
    num_accepted: torch.Tensor,  # (B,)
    valid: torch.Tensor,  # (B,) bool: the rows whose crafted coins stop at `stop`
    draft_tokens: torch.Tensor,  # (B, K)
    resample: torch.Tensor,  # (B, K+1, V) the closed form's emission distributions
    race: torch.Tensor,  # (B, V) the Exp(1) noise the op was given
) -> None:
    """The valid rows kept drafts[:stop], emitted the race's token over resample[:, stop], then padding."""
    assert valid.any()
    assert (num_accepted[valid] == stop).all()
    expected_token = (resample[:, stop] / race).argmax(-1)
    assert torch.equal(output[valid, stop], expected_token[valid])
    assert resample[valid, stop].gather(1, expected_token[valid, None]).gt(0).all()
    assert torch.equal(output[valid, :stop], draft_tokens[valid, :stop])
    assert (output[valid, stop + 1:] == PAD_TOKEN_ID).all()


def one_hot_case(rows: int = 500, k: int = 3, vocab: int = 7, seed: int = 5):
    """(logits, p, q, drafts, generator): p one-hot at the logits' argmax, drafts drawn from q, and the
    first fifth of the rows drafting the argmax everywhere (they accept every draft)."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, k + 1, vocab, generator=gen)
    p = torch.nn.functional.one_hot(logits.argmax(-1), vocab).float()
    q = torch.softmax(torch.randn(rows, k, vocab, generator=gen), -1)
    drafts = torch.multinomial(q.view(-1, vocab), 1, generator=gen).view(rows, k)
    drafts[: rows // 5] = logits[: rows // 5, :k].argmax(-1)
    return logits, p, q, drafts, gen
