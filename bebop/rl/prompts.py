"""The prompts of each RL step and the task's reward: embedded problems or a data file's rows.

Prompts are a function of (seed, step) only, so a resumed run sees the same batches.
"""

from __future__ import annotations

from dataclasses import dataclass

from bebop.rl.config import RLConfig
from bebop.rl.data import load_prompts
from bebop.rl.rewards import RewardFn, load_reward, math_reward
from bebop.task import arith
from bebop.utils.io import BebopError
from bebop.utils.tokens import encode_prompt

TASK_REWARDS: dict[str, RewardFn] = {"embedded": arith.arith_reward, "math": math_reward}  # reward when reward=""
PROMPT_IDS = "__prompt_ids"  # the row key holding the prompt's token ids (not a reward field)
STEP_SEED_STRIDE = 1_000_003  # prime spacing of (seed, step) -> problem seed, so nearby runs do not share problems


@dataclass(frozen=True)
class PromptBatch:
    """The prompts of one RL step."""

    step: int  # 0-based RL step; keys the rollout seeds (logged as step + 1 = steps completed)
    prompts: list[str]  # (B,) prompt texts (chat prompts rendered by the template), what rewards see
    fields: dict[str, list]  # extra per-prompt fields for the reward (e.g. answer), each (B,)
    prompt_ids: list[list[int]] | None = None  # (B,) what the model sees (bebop.utils.tokens); None: encode prompts


def step_seed(seed: int, step: int) -> int:
    """Seed of the embedded task's problems at ``step``: a function of (seed, step) only."""
    return seed * STEP_SEED_STRIDE + step


def load_task_rows(cfg: RLConfig, tokenizer) -> list[dict] | None:
    """The prompt rows of task math (chat prompts rendered with the chat template); None for embedded."""
    if cfg.task == "embedded":
        return None
    try:
        rows = load_prompts(cfg.data)
    except (FileNotFoundError, ValueError, ImportError) as e:
        raise BebopError(str(e)) from None
    rendered = []
    for i, row in enumerate(rows, start=1):
        prompt = row["prompt"]
        try:
            ids = encode_prompt(tokenizer, prompt)  # NOTE: the model sees these ids, not a re-encoded text (one BOS)
        except BebopError as e:
            raise BebopError(f"{cfg.data} row {i}: {e}") from None
        if isinstance(prompt, list):
            prompt = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        rendered.append({**row, "prompt": prompt, PROMPT_IDS: ids})
    return rendered


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
