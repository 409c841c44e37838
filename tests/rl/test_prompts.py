"""bebop.rl.prompts and the task/data rules of bebop.rl.config: a data file is the prompts it names."""

from __future__ import annotations

import json

import pytest

from bebop.rl.config import resolve_rl_config
from bebop.rl.prompts import load_task_rows, prompt_batch
from bebop.utils.errors import BebopError
from bebop.utils.tokens import encode_prompt
from tests.helpers.models import tiny_tokenizer


def test_data_implies_the_file_task():
    assert resolve_rl_config(None, {"data": "prompts.jsonl"}).task == "math"
    assert resolve_rl_config(None, {}).task == "embedded"
    with pytest.raises(BebopError, match="would be ignored"):
        resolve_rl_config(None, {"data": "prompts.jsonl", "task": "embedded"})


def test_chat_prompts_reach_the_model_with_one_bos(tmp_path):
    """Rewards see the rendered text; the engine gets the template's own ids (rendering to text and
    encoding that again used to add a second BOS)."""
    tok = tiny_tokenizer(add_bos=True)
    chat = [{"role": "user", "content": "a b"}]
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": chat, "answer": "1"}) + "\n" + json.dumps({"prompt": "c"}) + "\n")
    cfg = resolve_rl_config(None, {"data": str(data), "prompts_per_step": 2})
    batch = prompt_batch(cfg, 0, load_task_rows(cfg, tok))
    assert batch.prompt_ids == [encode_prompt(tok, chat), encode_prompt(tok, "c")] == [[1, 4, 5, 15], [1, 6]]
    assert batch.prompts[0] == "<s>a b l" and set(batch.fields) == {"answer"}


def test_bad_prompt_type_names_the_row(tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "a"}) + "\n" + json.dumps({"prompt": [1, 2]}) + "\n")
    with pytest.raises(BebopError, match=r"p.jsonl:2: a prompt must be a string or a list of chat messages"):
        load_task_rows(resolve_rl_config(None, {"data": str(data)}), tiny_tokenizer())
