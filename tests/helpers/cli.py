"""What a command reads from disk, built offline: a model directory, a user's work directory, a cache
filled by `bebop pretrain` and `bebop train-mtp`; and the one error line a refused command prints."""

from __future__ import annotations

import pytest

from tests.helpers.models import tiny_model, tiny_tokenizer


def save_model_dir(path, model, add_bos: bool = True):
    """Saves ``model`` with ``tiny_tokenizer(add_bos)`` as an HF directory the CLI's --model loads."""
    model.config.eos_token_id, model.config.bos_token_id = 2, 1
    model.save_pretrained(path)
    tiny_tokenizer(add_bos).save_pretrained(path)
    return path


REWARD_MODULE = "def score(prompts, completions, **_):\n    return [1.0] * len(completions)\n"  # rewards:score


def model_workdir(root):
    """``root`` holding what a command on a user's model reads: ``model`` (a tiny Llama), its ``head``,
    ``prompts.jsonl`` (two prompts) and ``rewards.py`` (``rewards:score``)."""
    from bebop.mtp import MtpHead

    model = tiny_model("llama", vocab_size=16)
    save_model_dir(root / "model", model)
    MtpHead(model).save_pretrained(root / "head")
    (root / "prompts.jsonl").write_text('{"prompt": "a b"}\n{"prompt": "c d"}\n')
    (root / "rewards.py").write_text(REWARD_MODULE)
    return root


def fill_tiny_cache(path, mp: pytest.MonkeyPatch):
    """Points BEBOP_CACHE_DIR at ``path`` and fills it with a barely-trained embedded model and head."""
    from bebop.cli import main

    mp.setenv("BEBOP_CACHE_DIR", str(path))
    assert main(["pretrain", "--steps", "3", "--eval-problems", "4"]) == 0
    assert main(["train-mtp", "--steps", "2", "--num-sequences", "8", "--batch-size", "4"]) == 0
    return path


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("bebop: error: ")
    return err[-1]
