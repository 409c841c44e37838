"""bebop.mtp.data.load_sequences and bebop.utils.tokens: data tokenized exactly as generation sees it.

With a Llama-style tokenizer (prepends BOS = 1, EOS = 2): a prompt/completion row is the prompt's
ids as the engine encodes them, then the completion without BOS and with EOS, so every row holds
exactly one BOS, at index 0 (two ``encode`` calls used to put a second BOS mid-row); chat prompts go
through the chat template once; ``token_ids`` rows are the whole sequence.
"""

from __future__ import annotations

import json

import pytest

from bebop.mtp.data import load_sequences
from bebop.utils.errors import BebopError
from bebop.utils.tokens import encode_completion, encode_prompt
from tests.helpers.models import tiny_tokenizer

BOS, EOS = 1, 2


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_prompt_completion_rows_have_one_bos_and_end_with_eos(tmp_path):
    tok = tiny_tokenizer(add_bos=True)
    data = load_sequences(_write(tmp_path / "d.jsonl", [{"prompt": "a b", "completion": "c d e"}]), tok)
    assert data.token_ids == [[BOS, 4, 5, 6, 7, 8, EOS]] and data.starts == [3]
    assert data.token_ids[0][:3] == encode_prompt(tok, "a b")  # the prompt as the engine encodes it


def test_completion_already_ending_with_eos_gets_no_second_one():
    assert encode_completion(tiny_tokenizer(), "c </s>") == [6, EOS]
    assert encode_completion(tiny_tokenizer(), "c", add_eos=False) == [6]


def test_chat_prompts_use_the_template_once(tmp_path):
    tok = tiny_tokenizer(add_bos=True)
    chat = [{"role": "user", "content": "a b"}]
    data = load_sequences(_write(tmp_path / "d.jsonl", [{"prompt": chat, "completion": "c"}]), tok)
    assert data.token_ids == [[BOS, 4, 5, 15, 6, EOS]] and data.starts == [4]  # 15 = "l", the generation prompt


def test_tokenizer_without_bos_and_text_rows(tmp_path):
    tok = tiny_tokenizer(add_bos=False)
    rows = [{"prompt": "a", "completion": "b c"}, {"text": "a b c d"}, {"token_ids": [4, 5, 6, 7], "start": 2}]
    data = load_sequences(_write(tmp_path / "d.jsonl", rows), tok)
    assert data.token_ids == [[4, 5, 6, EOS], [4, 5, 6, 7], [4, 5, 6, 7]] and data.starts == [1, 1, 2]


def test_bad_prompt_names_file_and_line(tmp_path):
    path = _write(tmp_path / "d.jsonl", [{"prompt": "a", "completion": "b c"}, {"prompt": 3, "completion": "b"}])
    with pytest.raises(BebopError, match=r"d.jsonl line 2: a prompt must be a string or a list of chat messages"):
        load_sequences(path, tiny_tokenizer())
