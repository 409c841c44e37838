"""Reference checks: does Bebop's *plain* sampling draw from the model's own distribution?

The lossless checks compare speculative with plain sampling, both run by Bebop's engine, so a
defect the two share (a wrong attention mask, a missing logit soft-cap) passes them. These checks
compare the engine's plain sampling with the distribution the model itself defines: ``num_samples``
completions of ``REF_TOKENS`` tokens are drawn with ``mode="none"``, then one plain HF forward pass
over each full sequence (prompt + completion, the model's own ``forward``, no Bebop code) gives
p(x_i | prompt, x_<i) at every generated position i.

Test (per prompt and temperature, over tokens 1..REF_TOKENS): given the prefixes, the tokens at
position i are independent draws, row r from its own p_r. With O the counts of each token and
E = sum_r p_r, the vector O - E has covariance C = sum_r diag(p_r) - p_r p_r^T, and
(O - E)^T C^+ (O - E) is chi-square with rank(C) degrees of freedom (the CLT over rows; Pearson's
statistic is the special case of equal p_r). Statistics and degrees of freedom add over positions,
which are conditionally independent. Tokens expected fewer than MIN_EXPECTED times are pooled
into one cell first, as in ``bebop.check.lossless``.

Prompts: the tested prompt (the first one), and, when the model has sliding-window layers, a long
prompt that puts every generated token two windows past its start (``reference_prompts``), so a
window the engine ignored changes the sampled distribution. Its rows are capped at
LONG_PROMPT_TOKENS prompt tokens per check (200 rows at least), so long windows stay affordable.

False-alarm odds: alpha per check, like every lossless check; each check is an event of its own, and
a failing one is retested on fresh samples (``bebop.check.verdict``).
Temperatures: those of the lossless configs without top-k/top-p (top-k/top-p cut the support at
ties, which the engine's and HF's rounding may break differently); they are pinned by unit tests.
"""

from __future__ import annotations

import torch

from bebop.speculative import attention
from bebop.speculative.engine import SamplingParams, SpecConfig, generate
from bebop.check.lossless import CHUNK_ROWS, MIN_EXPECTED, LosslessCheck, LosslessConfig, chi2_sf
from bebop.check.verdict import retest_seed

REF_TOKENS = 6  # generated tokens per row compared with the model's forward pass
LONG_PROMPT_WINDOWS = 2  # the long prompt spans this many windows: later tokens see only the last window
LONG_PROMPT_TOKENS = 2_000_000  # prompt tokens per long-prompt check (bounds its rows: 244 at a 4096 window)
FORWARD_TOKENS = 32_768  # rows x sequence length per HF forward call (bounds activation memory)
LOGITS_ELEMENTS = 2**24  # rows x REF_TOKENS x V logits per HF forward call (their float64 softmax: 128 MB)


def conditional_chi2(tokens: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Chi-square statistic and dof of draws ``tokens`` (N,) against their own distributions ``probs`` (N, V).

    Row r's token is assumed drawn from probs[r]. Tokens expected fewer than MIN_EXPECTED times are
    pooled into one cell (folded into the smallest kept cell if that cell would itself be too small).

    Example: 10_000 rows all with p = (0.5, 0.5) and 5_000 of each token -> (0.0, 1).
    """
    probs = probs.double()
    expected = probs.sum(0)  # (V,)
    observed = torch.bincount(tokens, minlength=probs.shape[1]).double()  # (V,)
    kept = (expected >= MIN_EXPECTED).nonzero()[:, 0]
    rare = (expected < MIN_EXPECTED).nonzero()[:, 0]
    cells = [probs[:, kept]]  # (N, C) per-row probabilities of each cell
    cell_obs = [observed[kept]]
    if len(rare):
        other_p, other_o = probs[:, rare].sum(1, keepdim=True), observed[rare].sum(0, keepdim=True)
        if other_p.sum() >= MIN_EXPECTED or len(kept) == 0:
            cells.append(other_p)
            cell_obs.append(other_o)
        else:
            smallest = int(expected[kept].argmin())
            cells[0][:, smallest] += other_p[:, 0]
            cell_obs[0][smallest] += other_o[0]
    p, o = torch.cat(cells, 1), torch.cat(cell_obs)  # (N, C), (C,)
    if p.shape[1] < 2:
        return 0.0, 0
    diff = (o - p.sum(0))[:-1]  # the last cell is implied by the others (counts sum to N)
    q = p[:, :-1]
    cov = torch.diag(q.sum(0)) - q.T @ q  # (C-1, C-1)
    return float(diff @ torch.linalg.pinv(cov, hermitian=True) @ diff), int(torch.linalg.matrix_rank(cov))


def _model_logits(model, sequences: list[list[int]], prompt_len: int):
    """Yields (first row, logits (n, REF_TOKENS, V)) of the model's own forward at the generated positions.

    The forward makes logits only at the last REF_TOKENS + 1 positions (HF's ``logits_to_keep``), and a call
    takes at most LOGITS_ELEMENTS // (REF_TOKENS * V) rows, so memory does not grow with V x the prompt.
    """
    device = next(model.parameters()).device
    width = prompt_len + REF_TOKENS
    vocab = model.config.get_text_config().vocab_size
    rows_per_call = max(1, min(FORWARD_TOKENS // width, LOGITS_ELEMENTS // (REF_TOKENS * vocab)))
    for start in range(0, len(sequences), rows_per_call):
        chunk = [s + [0] * (width - len(s)) for s in sequences[start : start + rows_per_call]]  # right padding
        ids = torch.tensor(chunk, dtype=torch.long, device=device)
        with torch.no_grad():  # positions prompt_len - 1 .. width - 2 predict the generated tokens
            yield start, model(input_ids=ids, logits_to_keep=REF_TOKENS + 1).logits[:, :REF_TOKENS]


def _reduced_draws(model, completions: list[list[int]], prompt: list[int], temperature: float):
    """Per generated position i: (cell of each live row's token (n_i,), per-row cell probabilities (n_i, C_i + 1)).

    The cells are the tokens expected at least MIN_EXPECTED times at position i, plus one cell for the
    rest of the vocabulary: ``conditional_chi2`` pools the same tokens, so the statistic is unchanged,
    but memory is N x C (C <= N / MIN_EXPECTED) instead of N x V (which at V = 151,936 and N = 10,000
    would be 72 GB). Two forward passes: the first sums the expected counts, the second gathers.
    """
    sequences = [prompt + c for c in completions]
    live = [[r for r, c in enumerate(completions) if len(c) > i] for i in range(REF_TOKENS)]
    is_live = torch.tensor([[len(c) > i for i in range(REF_TOKENS)] for c in completions])  # (N, REF_TOKENS)
    expected = None  # (REF_TOKENS, V)
    for start, logits in _model_logits(model, sequences, len(prompt)):
        p = torch.softmax(logits.double() / temperature, dim=-1).cpu()  # (n, REF_TOKENS, V)
        p = p * is_live[start : start + len(p), :, None]
        expected = p.sum(0) if expected is None else expected + p.sum(0)
    kept = [(expected[i] >= MIN_EXPECTED).nonzero()[:, 0] for i in range(REF_TOKENS)]
    parts: list[list[torch.Tensor]] = [[] for _ in range(REF_TOKENS)]
    for start, logits in _model_logits(model, sequences, len(prompt)):
        p = torch.softmax(logits.double() / temperature, dim=-1).cpu()
        for i in range(REF_TOKENS):
            q = p[:, i, kept[i]]  # (n, C_i)
            parts[i].append(torch.cat([q, (1.0 - q.sum(1, keepdim=True)).clamp_min(0.0)], 1))
    out = []
    for i in range(REF_TOKENS):
        if not live[i]:
            out.append(None)
            continue
        cell_of = torch.full((expected.shape[1],), len(kept[i]), dtype=torch.long)
        cell_of[kept[i]] = torch.arange(len(kept[i]))
        tokens = torch.tensor([completions[r][i] for r in live[i]])
        out.append((cell_of[tokens], torch.cat(parts[i])[live[i]]))
    return out


def reference_prompts(model, tokenizer, prompts: list, seed: int = 0) -> list[list[int]]:
    """The tested prompt's ids, plus a long prompt past the largest sliding window when the model has one.

    The long prompt is ``LONG_PROMPT_WINDOWS`` windows of seeded random ordinary tokens followed by
    the tested prompt: its early part differs from its late part, so whether a generated token sees
    it (full attention) or not (sliding window) changes p.
    """
    tested = list(prompts[0] if not isinstance(prompts[0], str) else tokenizer.encode(prompts[0]))
    out = [tested]
    config = model.config.get_text_config()
    windows = [w for w in attention.layer_windows(config) if w is not None]
    max_pos = getattr(config, "max_position_embeddings", None)
    length = LONG_PROMPT_WINDOWS * max(windows, default=0) + 1
    if windows and (max_pos is None or length + REF_TOKENS + 1 <= max_pos) and length > len(tested):
        special = set(getattr(tokenizer, "all_special_ids", None) or []) | {tokenizer.eos_token_id}
        ordinary = torch.tensor([t for t in range(config.vocab_size) if t not in special])
        g = torch.Generator().manual_seed(seed)
        filler = ordinary[torch.randint(len(ordinary), (length - len(tested),), generator=g)].tolist()
        out.append(filler + tested)
    return out


def run_reference_checks(model, tokenizer, prompts: list, num_samples: int, seed: int, alpha: float,
                         configs: tuple[LosslessConfig, ...]) -> list[LosslessCheck]:
    """Compares Bebop's plain sampling with the model's own forward pass; one check per (prompt, temperature),
    and a failing check once more on fresh samples (``retest_seed``): each is an event of its own.

    Args:
        model, tokenizer: the target and its tokenizer (as for ``run_lossless_checks``).
        prompts: texts or token-id lists; see ``reference_prompts``.
        num_samples: completions per check.
        seed: run seed (these runs use steps 1000+, apart from the lossless runs).
        alpha: false-alarm odds per check.
        configs: the lossless configs; their temperatures without top-k/top-p are checked.

    Returns:
        ``LosslessCheck``s with mode "none" and k = 0, named "plain vs model forward ...", retests last.
    """
    temperatures = sorted({c.temperature for c in configs if not c.top_k and c.top_p >= 1}, reverse=True)
    cases = [(p_index, prompt, t_index, temperature)
             for p_index, prompt in enumerate(reference_prompts(model, tokenizer, prompts, seed))
             for t_index, temperature in enumerate(temperatures)]
    checks = [_reference_check(model, tokenizer, *case, num_samples, seed, alpha) for case in cases]
    checks += [_reference_check(model, tokenizer, *case, num_samples, retest_seed(seed), alpha, retest=True)
               for case, check in zip(cases, checks) if check.failed]
    return checks


def _reference_check(model, tokenizer, p_index: int, prompt: list[int], t_index: int, temperature: float,
                     num_samples: int, seed: int, alpha: float, retest: bool = False) -> LosslessCheck:
    """One prompt's plain sampling at one temperature against the model's forward (tokens 1..REF_TOKENS)."""
    sampling = SamplingParams(temperature=temperature, max_new_tokens=REF_TOKENS)
    num_rows = num_samples if p_index == 0 else min(num_samples, max(200, LONG_PROMPT_TOKENS // len(prompt)))
    completions = []
    for start in range(0, num_rows, CHUNK_ROWS):
        rows = min(CHUNK_ROWS, num_rows - start)
        result = generate(model, tokenizer, [prompt] * rows, sampling=sampling, spec=SpecConfig("none"),
                          seed=seed, step=1000 + 10 * p_index + t_index, row_ids=list(range(start, start + rows)))
        completions += result.token_ids
    statistic, dof = 0.0, 0
    for draws in _reduced_draws(model, completions, prompt, temperature):
        if draws is not None:  # rows that had not ended by this position
            s, d = conditional_chi2(*draws)
            statistic, dof = statistic + s, dof + d
    p_value = chi2_sf(statistic, dof) if dof else 1.0
    which = "tested prompt" if p_index == 0 else f"long prompt ({len(prompt)} tokens, past the window)"
    return LosslessCheck(
        name=f"plain vs model forward, {which}, T={temperature:g}, tokens 1-{REF_TOKENS}", mode="none",
        speculate_k=0, temperature=temperature, top_k=0, top_p=1.0, statistic=statistic, dof=dof, p_value=p_value,
        passed=p_value > alpha, token=REF_TOKENS, alpha=alpha, reference=f"model forward, {which}", retest=retest,
    )
