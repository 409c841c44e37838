"""The embedded task: add a list of small numbers, showing the running sum.

A prompt lists the terms; a completion adds them one at a time in *any* order, with free
phrasing, and ends with the answer::

    prompt:      Q 4 + 7 + 2 = ?
    completion:  take 7 . add 2 gives 9 . plus 4 makes 13 . A 13

Every completion that follows the format and ends with the true sum is correct, so the policy
has genuine choices (which term next, which connective, which verb) between deterministic
tokens (running sums, punctuation). That spread of next-token entropy is what acceptance
versus entropy needs; a task answered token-for-token deterministically would have none.

Pretraining also shows a second, careless solver (``make_guess``): it opens with a word of its
own (``guess``, ``say``, ``maybe``) and writes random numbers (the terms after the first and every
running sum), so it is almost never right::

    completion:  guess 7 . add 2 gives 131 . plus 4 makes 55 . A 55

A model pretrained on both is what a base LLM is to RL: a mixture of a careful and a careless
way to answer, the careless one far more uncertain (a random number is ln 200 = 5.3 nats).
Reinforcement learning that works drops the careless way, so accuracy rises while the policy's
entropy falls, as it does in real RL post-training (paper §1, Figs. 1a, 8).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from tokenizers import Tokenizer, models, pre_tokenizers

# Phrasing choices: the policy picks among them, so they carry the completion's entropy.
OPENERS = ("take", "start", "begin")
CONNECTIVES = ("add", "plus", "then")
VERBS = ("gives", "makes", "is")
GUESS_OPENERS = ("guess", "say", "maybe")  # the careless solver's first word (``make_guess``)
MAX_NUMBER = 199  # every integer 0..MAX_NUMBER is one token; sums stay below it

SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>")
PAD, EOS, UNK = SPECIAL_TOKENS
WORDS = ("Q", "+", "=", "?", ".", "A") + OPENERS + CONNECTIVES + VERBS + GUESS_OPENERS

_ANSWER = re.compile(r"\bA (\d+)\s*$")


@dataclass(frozen=True)
class ArithConfig:
    """Difficulty of the embedded task."""

    min_terms: int = 3  # fewest numbers to add
    max_terms: int = 5  # most numbers to add
    max_term: int = 9  # terms are drawn from 1..max_term (single digits: the careful way is learnable)


@dataclass(frozen=True)
class Problem:
    """One task instance: the prompt text and its checkable answer."""

    prompt: str
    answer: str
    terms: tuple[int, ...]


def make_problem(rng: random.Random, cfg: ArithConfig = ArithConfig()) -> Problem:
    """Draws one problem.

    Example: ``make_problem(random.Random(0))`` -> ``Problem(prompt="Q 13 + 2 + ... = ?", ...)``.
    """
    n = rng.randint(cfg.min_terms, cfg.max_terms)
    terms = tuple(rng.randint(1, cfg.max_term) for _ in range(n))
    prompt = "Q " + " + ".join(str(t) for t in terms) + " = ?"
    return Problem(prompt=prompt, answer=str(sum(terms)), terms=terms)


def make_solution(rng: random.Random, problem: Problem) -> str:
    """A correct completion: terms in a random order, random phrasing, the running sums."""
    order = list(problem.terms)
    rng.shuffle(order)
    total = order[0]
    parts = [f"{rng.choice(OPENERS)} {total} ."]
    for term in order[1:]:
        total += term
        parts.append(f"{rng.choice(CONNECTIVES)} {term} {rng.choice(VERBS)} {total} .")
    parts.append(f"A {total}")
    return " ".join(parts)


def make_guess(rng: random.Random, problem: Problem) -> str:
    """A careless completion: the careful format, but every number after the first is random.

    The terms it "adds" and the running sums are drawn uniformly from 0..MAX_NUMBER (ln 200 = 5.3
    nats each), and the answer repeats the last sum written, so it is right only by chance.
    """
    parts = [f"{rng.choice(GUESS_OPENERS)} {rng.choice(problem.terms)} ."]
    total = 0
    for _ in problem.terms[1:]:
        total = rng.randint(0, MAX_NUMBER)
        parts.append(f"{rng.choice(CONNECTIVES)} {rng.randint(0, MAX_NUMBER)} {rng.choice(VERBS)} {total} .")
    parts.append(f"A {total}")
    return " ".join(parts)


def is_guess(completion: str) -> bool:
    """True when the completion opens the careless solver's way (a word of GUESS_OPENERS)."""
    words = completion.split(maxsplit=1)
    return bool(words) and words[0] in GUESS_OPENERS


def make_problems(num: int, seed: int, cfg: ArithConfig = ArithConfig()) -> list[Problem]:
    """``num`` problems drawn from ``seed`` (the same seed always gives the same list)."""
    rng = random.Random(seed)
    return [make_problem(rng, cfg) for _ in range(num)]


def extract_answer(completion: str) -> str | None:
    """The number after the final ``A``, or None when the completion has no answer.

    Example: ``extract_answer("take 3 . add 4 is 7 . A 7")`` -> ``"7"``.
    """
    match = _ANSWER.search(completion.replace(EOS, "").strip())
    return match.group(1) if match else None


def arith_reward(prompts: list[str], completions: list[str], answer: list[str], **_: object) -> list[float]:
    """Reward 1.0 when the completion's final answer equals the true sum, else 0.0.

    A plain reward function (``bebop rl --reward bebop.task.arith:arith_reward``).
    """
    return [float(extract_answer(c) == a) for c, a in zip(completions, answer, strict=True)]


def build_tokenizer() -> Tokenizer:
    """A word-level tokenizer over the task's closed vocabulary (numbers, words, specials)."""
    vocab = list(SPECIAL_TOKENS) + list(WORDS) + [str(i) for i in range(MAX_NUMBER + 1)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok
