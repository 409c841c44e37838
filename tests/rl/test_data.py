"""Tests for bebop.rl.data.load_prompts."""

import json
import os
import sys

import pytest

from bebop.utils.errors import BebopError

from bebop.rl.data import load_prompts


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_jsonl_round_trip_keeps_extra_fields(tmp_path):
    rows = [
        {"prompt": "2+2?", "answer": "4", "source": "toy"},
        {"prompt": [{"role": "user", "content": "3+3?"}], "answer": 6},
    ]
    path = _write_jsonl(tmp_path / "prompts.jsonl", rows)
    assert load_prompts(path) == rows
    assert load_prompts(str(path)) == rows


def test_jsonl_skips_blank_lines(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a"}\n\n   \n{"prompt": "b"}\n')
    assert [row["prompt"] for row in load_prompts(path)] == ["a", "b"]


def test_missing_file(tmp_path):
    with pytest.raises(BebopError, match="prompt file not found"):
        load_prompts(tmp_path / "nope.jsonl")


def test_a_directory_or_a_pipe_is_named_as_such_not_as_missing(tmp_path):
    (tmp_path / "dir.jsonl").mkdir()
    os.mkfifo(tmp_path / "fifo.jsonl")
    with pytest.raises(BebopError, match=r"prompt file .*dir.jsonl is a directory, not a file"):
        load_prompts(tmp_path / "dir.jsonl")
    with pytest.raises(BebopError, match=r"fifo.jsonl is not a regular file \(a pipe, a device or standard input\)"):
        load_prompts(tmp_path / "fifo.jsonl")  # NOTE: refused before it is opened: reading it would block


def test_bad_json_names_the_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": "b",}\n')
    with pytest.raises(BebopError, match=r"p\.jsonl:2 is not valid JSON: "):
        load_prompts(path)


def test_missing_prompt_field(tmp_path):
    path = _write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a"}, {"question": "b"}])
    with pytest.raises(ValueError, match=r":2: missing required field 'prompt'"):
        load_prompts(path)


def test_row_not_an_object(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('["prompt", "a"]\n')
    with pytest.raises(ValueError, match=":1: expected a JSON object, got list"):
        load_prompts(path)


def test_prompt_of_wrong_type(tmp_path):
    path = _write_jsonl(tmp_path / "p.jsonl", [{"prompt": 3}])
    with pytest.raises(ValueError, match="must be a string or a list of chat messages"):
        load_prompts(path)


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_file(tmp_path, content):
    path = tmp_path / "p.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match="no prompts"):
        load_prompts(path)


def test_unsupported_suffix(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("prompt\na\n")
    with pytest.raises(ValueError, match="unsupported prompt file type '.csv'"):
        load_prompts(path)


def test_parquet_without_pyarrow_is_a_clear_error(tmp_path, monkeypatch):
    path = tmp_path / "p.parquet"
    path.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # makes `import pyarrow...` fail
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ImportError, match="needs pyarrow: pip install pyarrow"):
        load_prompts(path)


def test_parquet_round_trip(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b"], "answer": ["1", "2"]}), path)
    assert load_prompts(path) == [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "2"}]


def test_parquet_missing_prompt(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"question": ["a"]}), path)
    with pytest.raises(ValueError, match="row 0: missing required field 'prompt'"):
        load_prompts(path)
