"""The embedded task: deterministic problems, correct and diverse solutions, the reward, the tokenizer."""

from __future__ import annotations

import random

from bebop.embedded import build_tokenizer
from bebop.task import arith


def test_problems_are_deterministic_and_in_range():
    a, b = arith.make_problems(50, seed=3), arith.make_problems(50, seed=3)
    assert a == b
    cfg = arith.ArithConfig()
    for p in a:
        assert cfg.min_terms <= len(p.terms) <= cfg.max_terms
        assert all(1 <= t <= cfg.max_term for t in p.terms)
        assert p.answer == str(sum(p.terms))


def test_solutions_are_correct_and_diverse():
    rng = random.Random(0)
    problem = arith.Problem(prompt="Q 4 + 7 + 2 = ?", answer="13", terms=(4, 7, 2))
    solutions = {arith.make_solution(rng, problem) for _ in range(200)}
    assert len(solutions) > 50  # order and phrasing vary: several valid continuations
    for s in solutions:
        assert arith.extract_answer(s) == "13"
        words = s.split()
        assert words[0] in arith.OPENERS
        # every running sum is right
        total = int(words[1])
        for i, w in enumerate(words):
            if w in arith.VERBS:
                total += int(words[i - 1])
                assert int(words[i + 1]) == total


def test_reward():
    prompts = ["Q 1 + 2 = ?"] * 4
    completions = ["take 1 . add 2 is 3 . A 3", "take 1 . add 2 is 4 . A 4", "take 1 . add 2", "A 3 <eos>"]
    assert arith.arith_reward(prompts, completions, answer=["3"] * 4) == [1.0, 0.0, 0.0, 1.0]
    assert arith.extract_answer("no answer here") is None


def test_tokenizer_round_trip_and_closed_vocabulary():
    tok = build_tokenizer()
    rng = random.Random(1)
    for p in arith.make_problems(20, seed=1):
        text = p.prompt + " " + arith.make_solution(rng, p)
        ids = tok.encode(text)
        assert tok.unk_token_id not in ids
        assert tok.decode(ids) == text
    assert tok.eos_token_id is not None and tok.pad_token_id is not None


def test_guesses_keep_the_format_but_not_the_sums():
    rng = random.Random(0)
    problem = arith.Problem(prompt="Q 4 + 7 + 2 + 9 = ?", answer="22", terms=(4, 7, 2, 9))
    guesses = [arith.make_guess(rng, problem) for _ in range(300)]
    assert all(arith.is_guess(g) and not arith.is_guess(arith.make_solution(rng, problem)) for g in guesses)
    sums = set()
    for g in guesses:
        words = g.split()
        assert int(words[1]) in problem.terms and len(words) == 3 + 3 * 5 + 2  # opener, 3 steps, "A n"
        assert arith.extract_answer(g) == words[-4]  # the answer repeats the last running sum
        sums.update(int(words[i + 1]) for i, w in enumerate(words) if w in arith.VERBS)
    assert len(sums) > 150  # random running sums: high entropy, unlike the careful solver's one sum
    # right only by chance: at most a few of 300
    assert sum(arith.arith_reward([problem.prompt] * 300, guesses, answer=["22"] * 300)) <= 5
    assert not arith.is_guess("") and arith.is_guess("maybe 3 . A 3")
