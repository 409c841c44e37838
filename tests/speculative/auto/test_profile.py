"""Tests for bebop.speculative.auto.profile: the chooser's state through JSON, the key, and refused files.

What pins it: a restored chooser prices every setting exactly as the one it was saved from and
keeps or re-prices its last decision as it would have; a
missing file is a fresh start; a profile for another key (sampling, or a model file rewritten in
place), of another version, or not parsing is refused with one line and left untouched. The CLI's
use (probe every AUTO_EVERY calls) is pinned in tests/test_cli.py.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from bebop.speculative.auto import profile as profile
from bebop.speculative.auto.chooser import AutoChooser, candidates, generate_auto
from bebop.speculative.engine import SamplingParams, SpecConfig
from bebop.utils.io import BebopError
from tests.helpers import ToyTokenizer, peaked_model, perturbed_head, toy_prompts

SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=24)


def _learned() -> AutoChooser:
    """A chooser after a probing call, the probe confirming its decision (``AutoChooser.settle``) and a
    call keeping it."""
    model, chooser = peaked_model(), AutoChooser()
    for seed in range(3):
        generate_auto(model, ToyTokenizer(), toy_prompts((3, 4, 6)), mtp=perturbed_head(model, 0.1), chooser=chooser,
                      sampling=SAMPLING, seed=seed, probe=seed == 0)
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
    profile.save(path, key, chooser, 3)
    restored, calls = profile.load(path, key)
    assert calls == 3 and [f.name for f in tmp_path.iterdir() if f.name.startswith(".")] == []  # no temp file left
    options = candidates(SpecConfig("auto", "auto"))
    for generated in ([0, 0, 0], [5, 2, 9]):
        assert restored.choose(options, 3, restored.lengths.rows(generated, 24)).predictions == \
            chooser.choose(options, 3, chooser.lengths.rows(generated, 24)).predictions
    assert restored.costs.seconds == chooser.costs.seconds and restored.costs.weights == chooser.costs.weights
    assert json.loads(json.dumps(restored.to_state())) == json.loads(json.dumps(chooser.to_state()))  # held too
    assert (restored.held.mode, restored.held.speculate_k) == (chooser.held.mode, chooser.held.speculate_k)
    assert restored.holds(options) and chooser.holds(options)
    chooser.held.confirmed = False  # a decision awaiting its confirming probe stays so
    profile.save(path, key, chooser, 4)
    restored, _ = profile.load(path, key)
    assert not restored.held.confirmed and not restored.holds(options) and restored.confirm


def test_a_missing_profile_is_a_fresh_start(tmp_path):
    chooser, calls = profile.load(tmp_path / "none.json", _key(tmp_path))
    assert calls == 0 and not chooser.costs.seconds and not chooser.lengths.seen


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
    (lambda d: d.update(version=99), "not a version-3 profile"),
    (lambda d: d.update(version="1"), "not a version-3 profile"),
    (lambda d: d["chooser"].update(costs={"measured": [[1, [[1.0, 2.0]]]]}), "is corrupt"),
    (lambda d: d["chooser"]["acceptance"]["sums"]["rs"].append(1.0), "is corrupt"),
    (lambda d: d.update(calls=-1), "is corrupt"),
    (lambda d: d["chooser"]["held"].pop("mode"), "is corrupt"),
    (lambda d: d["chooser"].update(shape={"3": {"0": [1.0]}}), "is corrupt"),
])
def test_a_profile_that_does_not_fit_is_refused_and_kept(tmp_path, edit, message):
    path, key = tmp_path / "p.json", _key(tmp_path)
    profile.save(path, key, _learned(), 1)
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    with pytest.raises(BebopError, match=message) as err:
        profile.load(path, key)
    assert "\n" not in str(err.value) and json.loads(path.read_text()) == data


def test_a_profile_that_is_not_json_is_refused(tmp_path):
    path = tmp_path / "p.json"
    path.write_text("{not json")
    with pytest.raises(BebopError, match="not valid JSON"):
        profile.load(path, _key(tmp_path))


def test_a_profile_of_an_older_layout_is_a_fresh_start_and_replaced(tmp_path):
    """A version-1 profile (it carried a calibration and re-pricing state) starts the chooser afresh;
    the next save writes this version over it."""
    path, key = tmp_path / "p.json", _key(tmp_path)
    profile.save(path, key, _learned(), 3)
    data = json.loads(path.read_text())
    data.update(version=1)
    data["chooser"].update(log_ratio={"spec": 0.1}, pricing_s=0.001, since_s=None)
    path.write_text(json.dumps(data))
    chooser, calls = profile.load(path, key)
    assert calls == 0 and not chooser.costs.seconds and chooser.held is None
    profile.save(path, key, chooser, calls + 1)
    assert json.loads(path.read_text())["version"] == profile.VERSION == 3
