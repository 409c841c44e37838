"""The prompts of each RL step and the task's reward: embedded problems or a data file's rows.

Prompts are a function of (seed, step) only, so a resumed run sees the same batches.
"""

from __future__ import annotations

import inspect

from bebop.rl.config import RLConfig, max_speculate_k
from bebop.rl.data import load_prompt_rows
from bebop.rl.rewards import RewardFn, load_reward, math_reward
from bebop.rollout.runner import PromptBatch
from bebop.task import arith
from bebop.utils.errors import BebopError
from bebop.utils.tokens import encode_prompt

TASK_REWARDS: dict[str, RewardFn] = {"embedded": arith.arith_reward, "math": math_reward}  # reward when reward=""
PROMPT_IDS = "__prompt_ids"  # the row key holding the prompt's token ids (not a reward field)
STEP_SEED_STRIDE = 1_000_003  # prime spacing of (seed, step) -> problem seed, so nearby runs do not share problems


def step_seed(seed: int, step: int) -> int:
    """Seed of the embedded task's problems at ``step``: a function of (seed, step) only."""
    return seed * STEP_SEED_STRIDE + step


def load_task_rows(cfg: RLConfig, tokenizer, max_positions: int | None = None,
                   reward_fn: RewardFn | None = None) -> list[dict] | None:
    """The prompt rows of task math, rendered and checked in one pass before any step; None for embedded.

    Chat prompts are rendered with the chat template. Every row must give a non-empty prompt that
    fits ``max_positions`` with the completion and verify slots, and every field ``reward_fn``
    requires (``reward_fields``); the error names the line of the first row that does not.
    """
    if cfg.task == "embedded":
        return None
    try:
        rows = load_prompt_rows(cfg.data)
    except (FileNotFoundError, ValueError, ImportError) as e:
        raise BebopError(str(e)) from None
    required = reward_fields(reward_fn) if reward_fn is not None else []
    rendered = []
    for where, row in rows:
        prompt = row["prompt"]
        try:
            ids = encode_prompt(tokenizer, prompt)  # NOTE: the model sees these ids, not a re-encoded text (one BOS)
        except BebopError as e:
            raise BebopError(f"{where}: {e}") from None
        if isinstance(prompt, list):
            try:
                prompt = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
            except Exception as e:  # noqa: BLE001 - any template failure is a bad row
                raise BebopError(f"{where}: cannot apply the chat template: {str(e).splitlines()[0]}") from None
        missing = [name for name in required if name not in row]
        if missing:
            raise BebopError(f"{where}: the reward needs field(s) {missing}; the row has {sorted(row)}")
        check_prompt_fits(cfg, ids, max_positions, where)
        rendered.append({**row, "prompt": prompt, PROMPT_IDS: ids})
    return rendered


def check_prompt_fits(cfg: RLConfig, prompt_ids: list[int], max_positions: int | None, where: str) -> None:
    """Raises BebopError (naming ``where``) when a prompt is empty or too long for a rollout."""
    num_tokens = len(prompt_ids)
    if num_tokens == 0:
        raise BebopError(f"{where}: empty prompt (no tokens)")
    slots = cfg.sampling.max_new_tokens + max_speculate_k(cfg) + 1  # as the engine counts
    if max_positions is not None and num_tokens + slots > max_positions:
        raise BebopError(f"{where}: prompt too long: {num_tokens} prompt tokens + {cfg.sampling.max_new_tokens} new tokens "
                         f"+ verify slots exceed the model's max_position_embeddings={max_positions}")


def check_embedded_prompts(cfg: RLConfig, tokenizer, max_positions: int | None) -> None:
    """Checks that the embedded task's longest prompts fit, in time independent of ``cfg.steps``.

    A prompt is "Q t1 + t2 + ... = ?" with at most ``max_terms`` single-digit terms; a tokenizer that
    splits at whitespace encodes each word on its own, so the longest prompt of any step has
    ``max_terms`` copies of one digit, and these nine prompts are checked.
    """
    task = arith.ArithConfig()
    for digit in range(1, task.max_term + 1):
        prompt = "Q " + " + ".join([str(digit)] * task.max_terms) + " = ?"
        check_prompt_fits(cfg, encode_prompt(tokenizer, prompt), max_positions, f"embedded task prompt {prompt!r}")


def reward_fields(reward_fn: RewardFn) -> list[str]:
    """The data fields ``reward_fn`` cannot do without: its keyword parameters with no default.

    Example: ``math_reward(prompts, completions, answer, **_)`` needs ``["answer"]``.
    """
    try:
        params = list(inspect.signature(reward_fn).parameters.values())
    except (TypeError, ValueError):  # builtins and some callables have no signature
        return []
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return [p.name for p in named[2:] if p.default is p.empty]


def prompt_batch(cfg: RLConfig, step: int, rows: list[dict] | None) -> PromptBatch:
    """The B prompts of ``step``: fresh embedded problems, or the data rows cycled in file order.

    Example: with 5 rows and B = 2, steps 0, 1, 2 use rows (0, 1), (2, 3), (4, 0).
    """
    num = cfg.prompts_per_step
    if rows is None:
        problems = arith.make_problems(num, seed=step_seed(cfg.seed, step))
        return PromptBatch(step, [p.prompt for p in problems], {"answer": [p.answer for p in problems]})
    chosen = [rows[(step * num + b) % len(rows)] for b in range(num)]
    keys = sorted(set().union(*chosen) - {"prompt", PROMPT_IDS})
    ids = [r[PROMPT_IDS] for r in chosen] if all(PROMPT_IDS in r for r in chosen) else None
    return PromptBatch(step, [r["prompt"] for r in chosen], {k: [r.get(k) for r in chosen] for k in keys}, ids)


def task_reward(cfg: RLConfig) -> RewardFn:
    """``cfg.reward`` when set, else the task's own reward."""
    if not cfg.reward:
        return TASK_REWARDS[cfg.task]
    try:
        return load_reward(cfg.reward)
    except (ValueError, ImportError) as e:
        raise BebopError(str(e)) from None
