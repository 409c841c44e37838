"""Tests for bebop.speculative.auto.profile: the chooser's state through JSON, the key, and refused files.

What pins it: a restored chooser prices every setting exactly as the one it was saved from and
keeps its last decision and call count; a missing file is a fresh start; a profile for another key
(sampling, or a model file rewritten in place) or of a newer version is refused with one line and left
untouched; a corrupt one (not JSON, NaN or out-of-range numbers, unknown setting names, fields that do
not fit) is renamed to NAME.bad with a one-line warning and the call starts fresh. The CLI's use (the
chooser's probe schedule across calls) is pinned in tests/test_cli.py.
"""

from __future__ import annotations

import json
import os
import re

import pytest
import torch

from bebop.speculative.auto import profile as profile
from bebop.speculative.auto.chooser import AutoChooser, candidates
from bebop.speculative.auto.generate import generate_auto
from bebop.speculative.engine import SamplingParams, SpecConfig
from bebop.utils.errors import BebopError
from tests.helpers.engine import ToyTokenizer, peaked_model, perturbed_head, toy_prompts

SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=24)


def _learned() -> AutoChooser:
    """A chooser after three calls, holding a decision (which calls probed and what they chose turn on timings)."""
    model, chooser = peaked_model(), AutoChooser()
    for seed in range(3):
        generate_auto(model, ToyTokenizer(), toy_prompts((3, 4, 6)), mtp=perturbed_head(model, 0.1), chooser=chooser,
                      sampling=SAMPLING, seed=seed)
    return chooser


def _key(tmp_path, **sampling) -> dict:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    if not (model / "model.safetensors").exists():
        (model / "model.safetensors").write_bytes(b"weights")
    return profile.profile_key(model, None, torch.device("cpu"), torch.float32,
                               SamplingParams(**{"temperature": 1.0, **sampling}), SpecConfig("auto", "auto"))


def test_a_restored_chooser_prices_as_the_saved_one(tmp_path):
    chooser, key, path = _learned(), _key(tmp_path), tmp_path / "p.json"
    chooser.settle(chooser.held)  # NOTE: a setting chosen before: confirmed, whatever the timings made the last probe
    profile.save(path, key, chooser)
    restored = profile.load(path, key)
    assert restored.calls == chooser.calls == 3 and [f.name for f in tmp_path.iterdir() if f.name.startswith(".")] == []  # no temp file left
    options = candidates(SpecConfig("auto", "auto"))
    restored.costs = chooser.costs  # NOTE: not carried: a probe times its own
    for generated in ([0, 0, 0], [5, 2, 9]):
        assert restored.choose(options, 3, restored.lengths.rows(generated, 24)).predictions == \
            chooser.choose(options, 3, chooser.lengths.rows(generated, 24)).predictions
    assert "costs" not in chooser.to_state()
    assert json.loads(json.dumps(restored.to_state())) == json.loads(json.dumps(chooser.to_state()))  # held too
    assert (restored.held.mode, restored.held.speculate_k) == (chooser.held.mode, chooser.held.speculate_k)
    assert restored.holds(options) and chooser.holds(options)
    chooser.held.confirmed = False  # a decision awaiting its confirming probe stays so
    profile.save(path, key, chooser)
    restored = profile.load(path, key)
    assert not restored.held.confirmed and not restored.holds(options) and restored.confirm


def test_a_missing_profile_is_a_fresh_start(tmp_path):
    chooser = profile.load(tmp_path / "none.json", _key(tmp_path))
    assert chooser.calls == 0 and not chooser.costs.seconds and not chooser.lengths.seen


def test_a_version_4_profile_with_a_prefill_field_still_loads(tmp_path):
    """A chooser field this code does not read (``prefill_s``, in some version-4 profiles) is ignored."""
    chooser, key, path = _learned(), _key(tmp_path), tmp_path / "p.json"
    profile.save(path, key, chooser)
    data = json.loads(path.read_text())
    data["chooser"]["prefill_s"] = 0.01
    path.write_text(json.dumps(data))
    restored = profile.load(path, key)
    assert restored.calls == 3 and path.exists() and restored.to_state() == json.loads(json.dumps(chooser.to_state()))


def test_the_key_follows_sampling_and_the_model_files(tmp_path):
    key = _key(tmp_path)
    assert _key(tmp_path) == key and _key(tmp_path, top_p=0.9) != key
    assert profile.default_path(key) != profile.default_path(_key(tmp_path, top_p=0.9))
    weights = tmp_path / "model" / "model.safetensors"
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # retrained in place
    assert _key(tmp_path)["model"] != key["model"]


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(key={**d["key"], "temperature": 0.5}), "temperature differ"),
    (lambda d: d.update(version=99), "not a version-4 profile"),
    (lambda d: d.update(version="1"), "not a version-4 profile"),
])
def test_a_profile_for_another_setup_is_refused_and_kept(tmp_path, edit, message):
    path, key = tmp_path / "p.json", _key(tmp_path)
    profile.save(path, key, _learned())
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    with pytest.raises(BebopError, match=message) as err:
        profile.load(path, key)
    assert "\n" not in str(err.value) and json.loads(path.read_text()) == data


def _set_held_prediction(d, value):
    d["chooser"]["held"]["predictions"]["rs3"] = value


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["chooser"].update(lengths=["x"]), "ValueError"),
    (lambda d: d["chooser"].update(every=0), "every 0 < 1"),
    (lambda d: d["chooser"]["acceptance"]["sums"]["rs"].append(1.0), "mismatched depths"),
    (lambda d: d.update(calls=-1), "calls -1 < 0"),
    (lambda d: d["chooser"]["held"].pop("mode"), "a held decision has fields"),
    (lambda d: d["chooser"]["held"].update(predicted_tok_s=-1e30), r"chooser.held.predicted_tok_s is -1e\+30"),
    (lambda d: d["chooser"]["acceptance"]["weights"].__setitem__(0, float("nan")), r"weights\[0\] is nan"),
    (lambda d: _set_held_prediction(d, float("inf")), r"predictions.rs3 is inf"),
    (lambda d: d["chooser"].update(tried=["rs3", "turbo9"]), "unknown setting name 'turbo9'"),
    (lambda d: d["chooser"]["held"].update(mode="turbo"), "unknown setting name 'turbo"),
    (lambda d: d["chooser"]["held"].update(speculate_k="3"), "unknown setting name \"[a-z]+'3'\""),
])
def test_a_corrupt_profile_is_set_aside_with_one_line_and_the_call_starts_fresh(tmp_path, edit, message, capsys):
    path, key = tmp_path / "p.json", _key(tmp_path)
    profile.save(path, key, _learned())
    data = json.loads(path.read_text())
    edit(data)
    text = json.dumps(data)  # NOTE: Python writes NaN and Infinity, as an edited file might hold them
    path.write_text(text)
    chooser = profile.load(path, key)
    assert chooser.calls == 0 and chooser.held is None and not chooser.tried
    assert not path.exists() and (tmp_path / "p.json.bad").read_text() == text
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"auto profile {path} is corrupt" in err[0] and "p.json.bad" in err[0]
    assert re.search(message, err[0]), err[0]
    path.write_text(text)  # a second bad file goes beside the first
    profile.load(path, key)
    assert (tmp_path / "p.json.bad-2").read_text() == text


def test_a_profile_that_is_not_json_is_set_aside(tmp_path, capsys):
    path = tmp_path / "p.json"
    path.write_text("{not json")
    chooser = profile.load(path, _key(tmp_path))
    assert chooser.calls == 0 and chooser.held is None and (tmp_path / "p.json.bad").is_file()
    assert "not valid JSON" in capsys.readouterr().err


def test_a_profile_of_an_older_layout_is_a_fresh_start_and_replaced(tmp_path):
    """An older profile (here version 1: it carried a calibration and re-pricing state) starts the
    chooser afresh; the next save writes this version over it."""
    path, key = tmp_path / "p.json", _key(tmp_path)
    profile.save(path, key, _learned())
    data = json.loads(path.read_text())
    data.update(version=1)
    data["chooser"].update(log_ratio={"spec": 0.1}, pricing_s=0.001, since_s=None)
    path.write_text(json.dumps(data))
    chooser = profile.load(path, key)
    assert chooser.calls == 0 and not chooser.costs.seconds and chooser.held is None
    profile.save(path, key, chooser)
    assert json.loads(path.read_text())["version"] == profile.VERSION == 4
