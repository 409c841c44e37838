"""evaluate_mtp and acceptance_table (``bebop.mtp.evaluate``): exact acceptance against a brute-force
reference, invariances, a head whose q is p, the table's rounding and clear errors."""

from __future__ import annotations

import math

import pytest
import torch
import transformers

from bebop.mtp.data import Sequences
from bebop.mtp.evaluate import acceptance_table, evaluate_mtp
from bebop.mtp.head import MtpHead
from bebop.utils.errors import BebopError
from tests.helpers.engine import VOCAB, peaked_model, perturbed_head, toy_prompts

K = 3
LENGTHS = (11, 6, 9, 4, 13)  # ragged rows: padding, chains cut by the end, a row with one one-step chain
STARTS = (3, 1, 0, 2, 5)  # start 0 drafts from t = 0 as start 1 does
ATOL = 1e-6  # evaluate_mtp (batched, padded float32) vs the per-chain reference (float32 logits): ~1.5e-7 seen


@pytest.fixture(scope="module")
def setup():
    """A peaked tiny model (p far from uniform), a jittered head (q != p) whose attention matters, and
    ragged data. The warm-started block barely attends (std-0.02 o_proj): both chain contexts would give
    almost the same q, so a std-1 o_proj makes their difference thousands of times ATOL."""
    model = peaked_model()
    head = perturbed_head(model, 0.3)
    o_proj = head.layers[0].mtp_block.self_attn.o_proj.weight
    with torch.no_grad():
        o_proj.copy_(torch.randn(o_proj.shape, generator=torch.Generator().manual_seed(7)))
    data = Sequences(toy_prompts(LENGTHS, seed=5), list(STARTS))
    return model, head, data


# ----------------------------------------------------------------------------- brute-force reference


def _unrolled_drafts(head, hidden, x, t: int, num_steps: int) -> torch.Tensor:
    """Draft logits (num_steps, V) of the chain at t, unrolled: depth j runs over positions 0..t (reading
    x_{s+j} at rotary position s + j - 1) with causal attention among its own depth-j entries."""
    g, pos, out = hidden[:, : t + 1], torch.arange(t + 1)[None], []
    for j in range(1, num_steps + 1):
        g = head.forward_step(g, x[:, j : t + 1 + j], pos + (j - 1), step=j - 1)
        out.append(head.logits(g[0, t], step=j - 1))
    return torch.stack(out)


def _served_drafts(head, hidden, x, t: int, num_steps: int) -> torch.Tensor:
    """Draft logits (num_steps, V) of the chain at t as an engine drafts: depth 1 over the committed
    positions 0..t fills a plain KV cache, then each depth j >= 2 is one query (x_{t+j} at t + j - 1)
    that sees every cached entry: the depth-1 ones of 0..t and its own chain's depths 2..j-1."""
    cache = transformers.DynamicCache()
    g = head.forward_step(hidden[:, : t + 1], x[:, 1 : t + 2], torch.arange(t + 1)[None], step=0, cache=cache)
    out, g = [head.logits(g[0, t], step=0)], g[:, t:]
    for j in range(2, num_steps + 1):
        visible = torch.zeros(1, 1, 1, t + j)  # (1, 1, 1, keys): the cache holds t + 1 + (j - 2) entries, plus this one
        g = head.forward_step(g, x[:, t + j : t + j + 1], torch.tensor([[t + j - 1]]), step=j - 1,
                              attention_bias=visible, cache=cache)
        out.append(head.logits(g[0, 0], step=j - 1))
    return torch.stack(out)


REFERENCE_DRAFTS = {"unrolled": _unrolled_drafts, "served": _served_drafts}


@torch.no_grad()
def _reference_chains(model, head, data: Sequences, num_steps: int, chain_context: str):
    """Per chain, one row at a time, unpadded: (target logits (S, V), draft logits (S, V)), S = its steps.

    Chains start at every t >= max(start - 1, 0) with t + 2 < len; step j exists iff t + j + 1 < len; the
    target of step j is the backbone's own logits at t + j (both predict x_{t+j+1}).
    """
    chains = []
    for ids, start in zip(data.token_ids, data.starts):
        x = torch.tensor([ids])
        target = model(input_ids=x).logits[0]  # (T, V)
        hidden = model.get_decoder()(input_ids=x).last_hidden_state  # (1, T, D)
        for t in range(max(start - 1, 0), len(ids) - 2):
            steps = min(num_steps, len(ids) - 2 - t)
            drafts = REFERENCE_DRAFTS[chain_context](head, hidden, x, t, steps)
            chains.append((target[t + 1 : t + 1 + steps], drafts))
    return chains


def _block_accepts_by_enumeration(p: torch.Tensor, q: torch.Tensor) -> float:  # (K, V) each
    """E[accepted drafts] of block verification: every draft sequence x ~ q, Σ_j w_j with
    w_j = min(1, w_{j-1} p_j(x_j) / q_j(x_j)) (Sun et al. 2024), summed with weight Π_j q_j(x_j)."""
    k, vocab = p.shape
    seqs = torch.cartesian_prod(*[torch.arange(vocab)] * k).view(-1, k)  # (V^K, K)
    steps = torch.arange(k)
    weight, total = torch.ones(len(seqs), dtype=torch.float64), torch.zeros(len(seqs), dtype=torch.float64)
    for j in range(k):
        weight = torch.minimum(torch.ones_like(weight), weight * p[j, seqs[:, j]] / q[j, seqs[:, j]])
        total += weight
    return float((q[steps, seqs].prod(1) * total).sum())


def _reference_stats(chains, num_steps: int, temperature: float) -> dict:
    """Per-step means of alpha_RS = sum_v min(p, q) and alpha_TO = p(argmax q) over every existing step,
    accept lengths 1 + mean over full chains of sum_j prod_{i<=j} alpha_i, and mean H(p) over steps."""
    sums = {"rs": [0.0] * num_steps, "to": [0.0] * num_steps, "count": [0] * num_steps}
    el_rs, el_to, el_block, entropy, num_full = 0.0, 0.0, 0.0, 0.0, 0
    for target, drafts in chains:
        logp = (target.double() / temperature).log_softmax(-1)
        p, q = logp.exp(), (drafts.double() / temperature).softmax(-1)
        rs = torch.minimum(p, q).sum(-1)
        to = p[torch.arange(len(p)), drafts.argmax(-1)]
        entropy += float(-(p * logp).sum())
        for j in range(len(p)):
            sums["rs"][j] += float(rs[j])
            sums["to"][j] += float(to[j])
            sums["count"][j] += 1
        if len(p) == num_steps:
            num_full += 1
            el_rs += float(rs.cumprod(0).sum())
            el_to += float(to.cumprod(0).sum())
            el_block += _block_accepts_by_enumeration(p, q)
    return {
        "alpha_rs": [s / n for s, n in zip(sums["rs"], sums["count"])],
        "alpha_to": [s / n for s, n in zip(sums["to"], sums["count"])],
        "accept_length_rs": 1 + el_rs / num_full,
        "accept_length_to": 1 + el_to / num_full,
        "accept_length_block": 1 + el_block / num_full,
        "target_entropy": entropy / sum(sums["count"]),
        "num_positions": len(chains),
        "num_full_chains": num_full,
    }


def _assert_results_close(result: dict, expected: dict, atol: float = ATOL) -> None:
    for key in ("alpha_rs", "alpha_to"):
        assert result[key] == pytest.approx(expected[key], abs=atol), key
    for key in ("accept_length_rs", "accept_length_to", "accept_length_block", "target_entropy"):
        assert result[key] == pytest.approx(expected[key], abs=atol), key
    assert result["accept_length_block"] >= result["accept_length_rs"] - atol  # block never accepts fewer
    assert result["accept_length_block_method"] == "exact" and result["accept_length_block_ci95"] == 0
    for key in ("num_positions", "num_full_chains"):
        assert result[key] == expected[key], key


# ----------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("chain_context", ["served", "unrolled"])
def test_evaluate_equals_brute_force_per_chain(setup, chain_context):
    """Every reported number equals the per-chain reference (each row alone, unpadded; served chains
    through an ordinary KV cache) at three temperatures; the two contexts differ from depth 2 on."""
    model, head, data = setup
    chains = _reference_chains(model, head, data, K, chain_context)
    assert len(chains) == 7 + 4 + 7 + 1 + 7  # chain starts t = max(start - 1, 0) .. len - 3 per row
    for temperature in (1.0, 0.5, 2.0):
        result = evaluate_mtp(model, head, data, speculate_k=K, temperature=temperature, chain_context=chain_context)
        expected = _reference_stats(chains, K, temperature)
        _assert_results_close(result, expected)
        echoed = (result["speculate_k"], result["temperature"], result["chain_context"])
        assert echoed == (K, temperature, chain_context)
        assert 0.05 < min(result["alpha_rs"]) and max(result["alpha_rs"]) < 0.95  # neither trivial case
    # The other context's reference would not pass: it differs from depth 2 on (depth 1 is shared).
    other = "unrolled" if chain_context == "served" else "served"
    other_alpha = _reference_stats(_reference_chains(model, head, data, K, other), K, 1.0)["alpha_rs"]
    gaps = [abs(a - b) for a, b in zip(other_alpha, _reference_stats(chains, K, 1.0)["alpha_rs"])]
    assert gaps[0] < ATOL and max(gaps[1:]) > 1000 * ATOL


def test_row_interval_clusters_the_chains_of_each_row(setup):
    """The accept lengths' 95% half-widths are the ratio estimator's over rows, from each row's own evaluation
    (S_r = its summed E[L], N_r its full chains), whatever the batching; one row has none."""
    model, head, data = setup
    alone = [evaluate_mtp(model, head, Sequences([ids], [start]), speculate_k=K)
             for ids, start in zip(data.token_ids, data.starts) if len(ids) - 1 - max(start, 1) >= K]  # others: N = 0
    assert len(alone) == 4
    result = evaluate_mtp(model, head, data, speculate_k=K, batch_size=2)
    assert result["num_rows"] == len(data)
    for key in ("rs", "to"):
        rows = [(r[f"accept_length_{key}"] - 1) * r["num_full_chains"] for r in alone], \
            [r["num_full_chains"] for r in alone]
        pairs = [(s, n) for s, n in zip(*rows) if n > 0]
        ratio = sum(s for s, _ in pairs) / sum(n for _, n in pairs)
        spread = sum((s - ratio * n) ** 2 for s, n in pairs) * len(pairs) / (len(pairs) - 1)
        half = 1.96 * math.sqrt(spread) / sum(n for _, n in pairs)
        assert result[f"accept_length_{key}_ci95"] == pytest.approx(half, rel=1e-5)
        assert half > 0.01
    assert alone[0]["accept_length_rs_ci95"] is None and alone[0]["num_rows"] == 1


def test_row_interval_by_hand():
    from bebop.mtp.evaluate import _row_ci95

    # Two rows, S = (2, 4), N = (1, 1): R = 3, sum (S - R N)^2 = 2, times n / (n - 1) = 2 -> 4, over (sum N)^2 = 4.
    rows = {"rows_n": 2, "rows_nn": 2.0, "rows_rs_ss": 20.0, "rows_rs_sn": 6.0}
    assert _row_ci95(rows, "rs", 6.0, 2) == pytest.approx(1.96)


def test_sampled_block_estimate_agrees_with_the_exact_one(setup, monkeypatch):
    """Forced to Monte Carlo, the block accept length is within 5 of its standard errors of the exact value
    (false-alarm odds about 6e-7), and says how it was sampled."""
    from bebop.speculative import block

    model, head, data = setup
    exact = evaluate_mtp(model, head, data, speculate_k=K)
    monkeypatch.setattr(block, "EXACT_MAX_ATOMS", 0)
    sampled = evaluate_mtp(model, head, data, speculate_k=K)
    se = sampled["accept_length_block_ci95"] / 1.96
    assert 0 < se < 0.05
    assert abs(sampled["accept_length_block"] - exact["accept_length_block"]) < 5 * se
    assert sampled["accept_length_block_method"] == f"monte carlo, {block.MC_DRAWS} draft chains per chain"
    assert sampled["accept_length_rs"] == exact["accept_length_rs"]


# ----------------------------------------------------------------------------- invariances


def test_batch_size_padding_and_row_order_do_not_change_results(setup):
    """Batches of 1 (no padding), 2 and all rows, another pad id, reversed rows and every row twice give
    the same means (twice the chains for the doubled data)."""
    model, head, data = setup
    base = evaluate_mtp(model, head, data, speculate_k=K, batch_size=len(data))
    variants = [
        evaluate_mtp(model, head, data, speculate_k=K, batch_size=1),
        evaluate_mtp(model, head, data, speculate_k=K, batch_size=2),
        evaluate_mtp(model, head, data, speculate_k=K, batch_size=len(data), pad_id=VOCAB - 1),
        evaluate_mtp(model, head, Sequences(data.token_ids[::-1], data.starts[::-1]), speculate_k=K, batch_size=2),
    ]
    for result in variants:
        _assert_results_close(result, base, atol=1e-6)
    doubled = evaluate_mtp(model, head, Sequences(data.token_ids * 2, data.starts * 2), speculate_k=K, batch_size=3)
    _assert_results_close(doubled, {**base, "num_positions": 2 * base["num_positions"],
                                    "num_full_chains": 2 * base["num_full_chains"]}, atol=1e-6)


def test_chunks_of_chains_give_the_whole_batch_result(setup, monkeypatch):
    """Logits made 4 chains at a time (EVAL_CHUNK_ELEMENTS) give the numbers of one chunk per batch."""
    from bebop.mtp import evaluate

    model, head, data = setup
    base = evaluate_mtp(model, head, data, speculate_k=K, batch_size=len(data))
    monkeypatch.setattr(evaluate, "EVAL_CHUNK_ELEMENTS", 4 * K * VOCAB)
    _assert_results_close(evaluate_mtp(model, head, data, speculate_k=K, batch_size=len(data)), base, atol=1e-6)


def test_one_step_accept_length_is_one_plus_alpha(setup):
    """With K = 1 every chain is full, so accept length = 1 + alpha_1 (E[L] = sum_j prod_{i<=j} alpha_i)."""
    model, head, data = setup
    result = evaluate_mtp(model, head, data, speculate_k=1, temperature=0.7)
    assert result["num_full_chains"] == result["num_positions"] == 26
    assert result["accept_length_rs"] == pytest.approx(1 + result["alpha_rs"][0], abs=1e-6)
    assert result["accept_length_to"] == pytest.approx(1 + result["alpha_to"][0], abs=1e-6)
    assert result["accept_length_block"] == pytest.approx(result["accept_length_rs"], abs=1e-6)  # K = 1: the same


def test_deeper_chains_keep_the_shallow_steps(setup):
    """Steps 1..K' of a K-step evaluation equal a K'-step one's: the mean at step j is over the chains
    that reach j, whatever K is (only E[L] is restricted to full chains)."""
    model, head, data = setup
    two = evaluate_mtp(model, head, data, speculate_k=2)
    four = evaluate_mtp(model, head, data, speculate_k=4)
    assert four["alpha_rs"][:2] == pytest.approx(two["alpha_rs"], abs=1e-6)
    assert four["alpha_to"][:2] == pytest.approx(two["alpha_to"], abs=1e-6)
    assert four["num_positions"] == two["num_positions"] and four["num_full_chains"] < two["num_full_chains"]


# ----------------------------------------------------------------------------- q = p


def _bigram_model_and_exact_head():
    """A one-layer peaked model whose layer is the identity (p at s depends only on x_s), and a head
    that reads only the next token's embedding through that same identity block: q_j at t equals p at
    t + j up to the norms' epsilon."""
    model = peaked_model(num_layers=1)
    layer = model.get_decoder().layers[0]
    with torch.no_grad():
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
    head = MtpHead(model)  # warm start: the block is a copy of the identity layer
    d = model.config.hidden_size
    pick_embedding = [torch.eye(d), torch.zeros(d, d)]
    with torch.no_grad():
        head.layers[0].eh_proj.weight.copy_(torch.cat(pick_embedding[::-1] if head.config.hidden_first
                                                      else pick_embedding, dim=1))
    return model, head


@pytest.mark.parametrize("chain_context", ["served", "unrolled"])
def test_head_equal_to_target_is_always_accepted(chain_context):
    """q = p gives alpha_RS = 1 at every step and accept length 1 + K, while alpha_TO = p(argmax p) = max p
    (below 1: p is peaked but not one-hot); a draft paired with the wrong target step would fall far below."""
    model, head = _bigram_model_and_exact_head()
    data = Sequences(toy_prompts(LENGTHS, seed=5), list(STARTS))
    result = evaluate_mtp(model, head, data, speculate_k=K, chain_context=chain_context)
    assert result["alpha_rs"] == pytest.approx([1.0] * K, abs=ATOL)
    assert result["accept_length_rs"] == pytest.approx(1 + K, abs=3e-5)
    with torch.no_grad():
        max_p = [model(input_ids=torch.tensor([ids])).logits[0].softmax(-1).amax(-1) for ids in data.token_ids]
    expected_to = [sum(float(m[t + j]) for m, ids, s in zip(max_p, data.token_ids, data.starts)
                       for t in range(max(s - 1, 0), len(ids) - 1 - j))
                   / sum(max(0, len(ids) - 1 - j - max(s - 1, 0)) for ids, s in zip(data.token_ids, data.starts))
                   for j in range(1, K + 1)]
    assert result["alpha_to"] == pytest.approx(expected_to, abs=ATOL)
    assert max(expected_to) < 0.99


# ----------------------------------------------------------------------------- table


def test_acceptance_table_rounds_to_three_decimals():
    results = {
        "ce": {"alpha_rs": [0.5, 0.25], "alpha_to": [0.4, 0.125], "accept_length_rs": 1.625,
               "accept_length_to": 1.45, "target_entropy": 2.0},
        "e2e_tv": {"alpha_rs": [0.91249, 0.87151], "alpha_to": [0.90149, 0.8496], "accept_length_rs": 2.70919,
                   "accept_length_to": 2.6668, "target_entropy": 0.44951},
    }
    results["e2e_tv"].update(accept_length_block=2.71251, accept_length_block_ci95=0.0021,
                             accept_length_multi={2: 2.80049, 4: 2.8512})
    results["e2e_tv"].update(accept_length_rs_ci95=0.04149, accept_length_to_ci95=None, num_rows=256)
    lines = acceptance_table(results).splitlines()
    assert lines[0] == ("| head | alpha_RS per step | alpha_TO per step | accept length RS | accept length RS block "
                        "| accept length RS, n drafts | accept length TO | H(p) nats | rows |")
    assert lines[1] == "|---|---|---|---|---|---|---|---|---|"
    assert lines[2:] == [
        "| ce | 0.500 0.250 | 0.400 0.125 | 1.625 | - | - | 1.450 | 2.000 | - |",
        "| e2e_tv | 0.912 0.872 | 0.901 0.850 | 2.709 ± 0.041 | 2.713 ± 0.002 | n=2 2.800, n=4 2.851 | 2.667 | 0.450 "
        "| 256 |",
    ]


def test_acceptance_table_of_an_evaluation(setup):
    model, head, data = setup
    result = evaluate_mtp(model, head, data, speculate_k=2)
    row = acceptance_table({"head": result}).splitlines()[2]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[0] == "head"
    assert cells[1].split() == [f"{a:.3f}" for a in result["alpha_rs"]]
    assert cells[2].split() == [f"{a:.3f}" for a in result["alpha_to"]]
    assert cells[3:5] == [f"{result['accept_length_rs']:.3f} ± {result['accept_length_rs_ci95']:.3f}",
                          f"{result['accept_length_block']:.3f}"]
    assert cells[5] == ", ".join(f"n={n} {v:.3f}" for n, v in result["accept_length_multi"].items())
    assert cells[6:] == [f"{result['accept_length_to']:.3f} ± {result['accept_length_to_ci95']:.3f}",
                         f"{result['target_entropy']:.3f}", str(len(data))]


# ----------------------------------------------------------------------------- bad input


BAD_INPUTS = [  # (evaluate_mtp keyword overrides, message)
    pytest.param({"speculate_k": 0}, "speculate_k must be an integer >= 1, got 0", id="k-zero"),
    pytest.param({"speculate_k": 2.0}, "speculate_k must be an integer >= 1, got 2.0", id="k-float"),
    pytest.param({"speculate_k": True}, "speculate_k must be an integer >= 1, got True", id="k-bool"),
    pytest.param({"speculate_k": 8}, "speculate_k=8 is deeper than the data allows: its longest completion has 8 "
                 "tokens, room for chains of 7 drafts; give --speculate-k 7 or less",
                 id="k-deeper-than-data"),
    pytest.param({"temperature": 0.0}, "temperature must be a finite number > 0, got 0.0", id="temperature-zero"),
    pytest.param({"temperature": -1.0}, "temperature must be a finite number > 0", id="temperature-negative"),
    pytest.param({"temperature": math.inf}, "temperature must be a finite number > 0", id="temperature-inf"),
    pytest.param({"temperature": math.nan}, "temperature must be a finite number > 0", id="temperature-nan"),
    pytest.param({"data": Sequences([], [])}, "no sequences to train or evaluate a draft on", id="empty-data"),
    pytest.param({"chain_context": "engine"}, "unknown chain context 'engine'; choose one of", id="unknown-context"),
    pytest.param({"head": "two layers"}, "chain context 'served' needs a head with one MTP layer, this one has 2",
                 id="served-two-layer-head"),
]


@pytest.mark.parametrize(("overrides", "message"), BAD_INPUTS)
def test_bad_input_is_one_clear_error(setup, overrides, message):
    model, head, data = setup
    if overrides.get("head") == "two layers":
        overrides = {**overrides, "head": MtpHead(model, num_layers=2)}
    kwargs = {"backbone": model, "head": head, "data": data, "speculate_k": K, **overrides}
    with pytest.raises(BebopError) as raised:
        evaluate_mtp(**kwargs)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_multi_draft_accept_lengths_extend_the_chain(setup):
    """One draft per row is the chain's own accept length; more drafts never accept less (exact, so
    equality and monotonicity hold to float rounding)."""
    model, head, data = setup
    result = evaluate_mtp(model, head, data, speculate_k=K, num_drafts=(1, 2, 4))
    multi = result["accept_length_multi"]
    assert multi[1] == pytest.approx(result["accept_length_rs"], abs=ATOL)
    assert multi[1] - ATOL <= multi[2] <= multi[4] + ATOL
    assert multi[4] <= 1 + K
