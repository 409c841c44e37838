"""Exact and safe outputs, each case as a user would type the command; one section each:

- heads with NaN/inf weights are refused when loaded, imported, exported and trained, and the
  engine refuses non-finite draft probabilities instead of sampling from them;
- import-mtp/export-mtp follow the output rules (non-empty only with --overwrite, which moves it
  aside; never an --out that is, contains or lies inside an input);
- export-mtp checks every head tensor's name and shape against the family's layout;
- an output directory is locked while a command writes it (the second command names the pid);
- a full device is one line naming the file, leaves nothing half-written and the previous
  checkpoint intact (a tiny tmpfs when this process may mount one, else a patched writer);
- export-mtp copies regular files only (no symlinks followed, no hard links) and names the rest.
"""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from bebop.cli import main
from bebop.mtp import MtpHead
from bebop.mtp.native import import_mtp
from bebop.speculative.engine import SamplingParams, SpecConfig, generate
from bebop.speculative.verification import finite_at_drafts
from bebop.utils.errors import BebopError
from bebop.utils.files import is_disk_full
from bebop.utils.locks import lock_holder, output_lock
from bebop.utils.outputs import output_dir
from tests.helpers.cli import save_model_dir
from tests.helpers.models import tiny_model, tiny_tokenizer
from tests.helpers.native_checkpoints import (
    keep_architectures,
    save_native_checkpoint,
    save_word_tokenizer,
    tiny_backbone,
)


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` by relative path, with its bytes."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def run(argv: list, capsys) -> tuple[int, str]:
    """(exit status, stderr) of ``bebop ARGV``."""
    capsys.readouterr()
    status = main([str(a) for a in argv] + ["--threads", "1"])
    return status, capsys.readouterr().err


def one_error_line(err: str) -> str:
    """The error line of a failed command, checking that it is the last line and no traceback came before."""
    lines = err.strip().splitlines()
    assert lines and lines[-1].startswith("bebop: error: "), err
    assert "Traceback" not in err, err
    return lines[-1]


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    """A tiny Qwen3.5 checkpoint with a native MTP layer and a tokenizer, and a head imported from it."""
    root = tmp_path_factory.mktemp("native")
    model = tiny_backbone("qwen3_5")
    tensors = save_native_checkpoint("qwen3_5", model, root / "model")
    save_word_tokenizer(root / "model")
    import_mtp(root / "model", model).save_pretrained(root / "head")
    return root, model, tensors


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """A tiny Llama model directory (no native MTP layer), its head, prompts and training data."""
    root = tmp_path_factory.mktemp("plain")
    model = tiny_model("llama", vocab_size=16)
    save_model_dir(root / "model", model)
    MtpHead(model).save_pretrained(root / "head")
    rows = [{"prompt": "a b", "answer": "7"}, {"prompt": "c d", "answer": "7"}]
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "data.jsonl").write_text(json.dumps({"token_ids": [1, 4, 5, 6, 7, 8, 9, 10], "start": 2}) + "\n")
    return root


def _write_head(directory: Path, state: dict[str, torch.Tensor], config_from: Path) -> Path:
    """A head directory holding ``state`` as is (what a corrupt or hand-edited head looks like on disk)."""
    directory.mkdir(parents=True)
    (directory / "mtp_config.json").write_text((config_from / "mtp_config.json").read_text())
    save_file({k: v.contiguous() for k, v in state.items()}, str(directory / "model.safetensors"))
    return directory


# ------------------------------------------------------------------------------------------------- NaN heads
def test_import_mtp_refuses_a_native_layer_holding_nan(native, tmp_path, capsys):
    root, model, tensors = native
    bad = tmp_path / "model"
    save_native_checkpoint("qwen3_5", model, bad)
    save_word_tokenizer(bad)
    fc = tensors["mtp.fc.weight"].clone()
    fc[3, 5] = float("nan")
    poisoned = {**tensors, "mtp.fc.weight": fc}
    save_file({k: v.contiguous() for k, v in poisoned.items()}, str(bad / "model-native-mtp.safetensors"))
    status, err = run(["import-mtp", "--model", bad, "--out", tmp_path / "head"], capsys)
    assert status == 2
    assert "mtp.fc.weight holds NaN or inf" in one_error_line(err)
    assert not (tmp_path / "head").exists()


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_generate_check_lossless_and_export_refuse_a_head_holding_nan_or_inf(native, tmp_path, capsys, value):
    root, _, _ = native
    state = load_file(str(root / "head" / "model.safetensors"))
    state["layers.0.eh_proj.weight"][0, 0] = value
    bad = _write_head(tmp_path / "bad-head", state, root / "head")
    status, err = run(["generate", "--model", root / "model", "--mtp", bad, "--out", tmp_path / "out.jsonl",
                       "--num-prompts", "1", "--max-new-tokens", "2"], capsys)
    assert status == 2 and "weight layers.0.eh_proj.weight holds NaN or inf" in one_error_line(err)
    assert not (tmp_path / "out.jsonl").exists()
    status, err = run(["check-lossless", "--model", root / "model", "--mtp", bad, "--samples", "100"], capsys)
    assert status == 2 and "holds NaN or inf" in one_error_line(err)
    status, err = run(["export-mtp", "--model", root / "model", "--mtp", bad, "--out", tmp_path / "served"], capsys)
    assert status == 2 and "holds NaN or inf" in one_error_line(err)
    assert not (tmp_path / "served").exists()


def test_a_head_holding_nan_is_never_saved(plain, tmp_path):
    model = tiny_model("llama", vocab_size=16)
    head = MtpHead(model)
    with torch.no_grad():
        head.layers[0].post_norm.weight[1] = float("nan")
    with pytest.raises(BebopError, match="post_norm.weight holds NaN or inf"):
        head.save_pretrained(tmp_path / "head")
    assert list(tmp_path.iterdir()) == []


def test_train_mtp_stops_before_a_non_finite_update(plain, tmp_path, capsys):
    """A learning rate of 1e30 sends the head's weights to ~1e30: the next loss overflows. The run
    stops before that update, in one line, and every checkpoint it left is finite."""
    out = tmp_path / "head"
    status, err = run(["train-mtp", "--model", plain / "model", "--data", plain / "data.jsonl", "--out", out,
                       "--steps", "6", "--batch-size", "2", "--speculate-k", "2", "--lr", "1e30", "--warmup-steps",
                       "1", "--save-every", "1", "--ce-warmup", "0"], capsys)
    assert status == 2
    line = one_error_line(err)
    assert re.search(r"step \d+ has .*(non-finite|NaN or inf).*stopped before the update", line)
    state = torch.load(out / "checkpoint" / "state.pt", weights_only=True)
    assert all(torch.isfinite(t).all() for t in state["head"].values())
    assert not (out / "model.safetensors").exists()  # no head was installed from the failed run


def _nan_head_generate(mode: str, temperature: float):
    model = tiny_model("llama", vocab_size=16)
    head = MtpHead(model)
    with torch.no_grad():
        head.layers[0].eh_proj.weight.fill_(float("nan"))
    sampling = SamplingParams(temperature=temperature, max_new_tokens=6)
    return generate(model, tiny_tokenizer(), ["a b c"], mtp=head, sampling=sampling,
                    spec=SpecConfig(mode=mode, speculate_k=2), seed=0)


@pytest.mark.parametrize("mode, temperature", [("rs", 1.0), ("to", 1.0), ("rs", 0.0)])
def test_engine_refuses_non_finite_draft_probabilities(mode, temperature):
    with pytest.raises(BebopError, match="drafted NaN or infinite probabilities"):
        _nan_head_generate(mode, temperature)


def test_finite_at_drafts_reads_a_row_through_its_drafts():
    q = torch.softmax(torch.tensor([[[0.0, 1.0, 2.0], [1.0, 1.0, 1.0]], [[0.0, float("nan"), 2.0], [0.0, 0.0, 0.0]]]),
                      -1)  # (B=2, K=2, V=3): row 1's first step saw a NaN logit
    drafts = torch.tensor([[2, 0], [0, 1]])
    assert finite_at_drafts(q, drafts).tolist() == [True, False]
    inf_logit = torch.softmax(torch.tensor([[[0.0, float("inf"), 1.0]]]), -1)  # +inf makes the row NaN too
    assert finite_at_drafts(inf_logit, torch.tensor([[0]])).tolist() == [False]


# ------------------------------------------------------------------------------------------------- import/export --out
@pytest.mark.parametrize("where, relation", [("model", "is"), ("model/sub", "lies inside"), (".", "contains")])
def test_import_mtp_never_writes_over_or_around_its_model(native, tmp_path, capsys, where, relation):
    root, model, _ = native
    work = tmp_path / "work"
    save_native_checkpoint("qwen3_5", model, work / "model")
    save_word_tokenizer(work / "model")
    before = snapshot(work)
    for extra in ([], ["--overwrite"]):
        status, err = run(["import-mtp", "--model", work / "model", "--out", work / where, *extra], capsys)
        assert status == 2 and f"{relation} the input" in one_error_line(err)
    assert snapshot(work) == before


def test_import_mtp_follows_the_output_rules(native, tmp_path, capsys):
    root, _, _ = native
    trained = tmp_path / "trained"
    trained.mkdir()
    (trained / "model.safetensors").write_bytes(b"a trained head")
    (tmp_path / "file").write_text("not a directory")
    import_ = ["import-mtp", "--model", root / "model", "--out"]
    status, err = run([*import_, trained], capsys)
    assert status == 2 and "is not empty" in one_error_line(err) and "--overwrite" in err
    status, err = run([*import_, tmp_path / "file", "--overwrite"], capsys)
    assert status == 2 and "is a file" in one_error_line(err)
    assert (tmp_path / "file").read_text() == "not a directory"
    assert run([*import_, trained, "--overwrite"], capsys)[0] == 0
    (old,) = tmp_path.glob("trained.old-*")
    assert (old / "model.safetensors").read_bytes() == b"a trained head"
    assert load_file(str(trained / "model.safetensors")).keys() == load_file(
        str(root / "head" / "model.safetensors")).keys()


def test_export_mtp_follows_the_output_rules(native, tmp_path, capsys):
    root, _, _ = native
    export = ["export-mtp", "--model", root / "model", "--mtp", root / "head", "--out"]
    before = snapshot(root)
    for out, message in ((root / "head", "is the input"), (root / "model" / "x", "lies inside the input"),
                         (root, "contains the input")):
        status, err = run([*export, out, "--overwrite"], capsys)
        assert status == 2 and message in one_error_line(err)
    assert snapshot(root) == before
    assert run([*export, tmp_path / "served"], capsys)[0] == 0
    status, err = run([*export, tmp_path / "served"], capsys)
    assert status == 2 and "is not empty" in one_error_line(err)
    assert run([*export, tmp_path / "served", "--overwrite"], capsys)[0] == 0
    assert len(list(tmp_path.glob("served.old-*"))) == 1


# ------------------------------------------------------------------------------------------------- export layout
def test_export_mtp_refuses_a_misshapen_or_incomplete_head(tmp_path, capsys):
    """MiMo names: input_proj is the projection, final_layernorm the output norm."""
    model = tiny_backbone("mimo")
    model.save_pretrained(tmp_path / "model")
    keep_architectures(model, tmp_path / "model")
    MtpHead(model).save_pretrained(tmp_path / "head")
    state = load_file(str(tmp_path / "head" / "model.safetensors"))
    wrong = _write_head(tmp_path / "wrong-shape", {**state, "layers.0.eh_proj.weight": torch.zeros(32, 32)},
                        tmp_path / "head")
    lacking = _write_head(tmp_path / "no-final-norm",
                          {k: v for k, v in state.items() if k != "layers.0.post_norm.weight"}, tmp_path / "head")
    extra = _write_head(tmp_path / "extra", {**state, "layers.0.bias": torch.zeros(3)}, tmp_path / "head")
    export = ["export-mtp", "--model", tmp_path / "model", "--out", tmp_path / "served", "--mtp"]
    status, err = run([*export, wrong], capsys)
    assert status == 2
    assert "model.mtp_layers.0.input_proj.weight (layers.0.eh_proj.weight) has shape (32, 32)" in one_error_line(err)
    assert "needs (32, 64)" in err
    status, err = run([*export, lacking], capsys)
    assert status == 2 and "lacks model.mtp_layers.0.final_layernorm.weight" in one_error_line(err)
    status, err = run([*export, extra], capsys)
    assert status == 2 and "holds layers.0.bias" in one_error_line(err)
    assert not (tmp_path / "served").exists()
    assert run([*export, tmp_path / "head"], capsys)[0] == 0  # the intact head exports


# ------------------------------------------------------------------------------------------------- locks
HOLDER = """
import sys, time
from bebop.utils.locks import output_lock
with output_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_second_command_on_a_run_being_written_names_the_holder(plain, tmp_path, capsys):
    run_dir = tmp_path / "run"
    rl = ["rl", "--model", plain / "model", "--data", plain / "prompts.jsonl", "--mode", "none", "--steps", "1",
          "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "3"]
    assert run([*rl, "--out", run_dir], capsys)[0] == 0
    before = snapshot(run_dir)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    try:
        assert holder.stdout.readline().strip() == "held"
        assert lock_holder(run_dir) == str(holder.pid)
        for extra in (["--out", run_dir, "--overwrite"], ["--resume", run_dir, "--steps", "2"]):
            status, err = run([*rl, *extra], capsys)
            assert status == 2
            assert f"is being written by another bebop command (pid {holder.pid})" in one_error_line(err)
        assert snapshot(run_dir) == before and not list(tmp_path.glob("run.old-*"))
    finally:
        holder.kill()
        holder.wait()
    assert run([*rl, "--out", run_dir, "--overwrite"], capsys)[0] == 0  # a killed holder leaves no lock


def test_rl_holds_its_run_directory_for_the_whole_run(plain, tmp_path, capsys, monkeypatch):
    """During every step the lock file beside the run names this process; after the run it is gone."""
    from bebop.rl import loop

    seen = []
    step = loop.rl_step

    def watched(*args, **kwargs):
        lock = tmp_path / ".run.pid"
        seen.append(lock.read_text().strip())
        with pytest.raises(BebopError, match=f"pid {os.getpid()}"), output_lock(tmp_path / "run"):
            pass  # another writer (a second open of the lock) is refused
        return step(*args, **kwargs)

    monkeypatch.setattr(loop, "rl_step", watched)
    status, _ = run(["rl", "--model", plain / "model", "--data", plain / "prompts.jsonl", "--mode", "none", "--steps",
                     "2", "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "3", "--out",
                     tmp_path / "run"], capsys)
    assert status == 0 and seen == [str(os.getpid())] * 2
    assert not (tmp_path / ".run.pid").exists()


def test_a_failed_command_leaves_its_output_as_it_found_it(tmp_path):
    """output_dir: a new directory a failed command leaves nothing worth keeping in is removed, and a
    directory moved aside by --overwrite comes back; one worth keeping stays."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "kept.txt").write_text("the earlier run")
    lines = []
    has_checkpoint = lambda d: (d / "ckpt").is_dir()  # noqa: E731 - what a trainer passes
    with pytest.raises(RuntimeError), output_dir(out, overwrite=True, announce=lines.append,
                                                 worth_keeping=has_checkpoint):
        (out / "metrics.jsonl").write_text("{}\n")  # a log of steps no checkpoint holds
        raise RuntimeError("the run failed")
    assert snapshot(out) == {"kept.txt": b"the earlier run"} and not list(tmp_path.glob("out.old-*"))
    assert lines[-1].startswith("bebop: moved") and lines[-1].endswith(f"back to {out}")
    with pytest.raises(RuntimeError), output_dir(tmp_path / "new", worth_keeping=has_checkpoint):
        (tmp_path / "new" / "ckpt").mkdir()
        raise RuntimeError("failed after a checkpoint")
    assert (tmp_path / "new" / "ckpt").is_dir()
    assert not (tmp_path / ".out.pid").exists() and not (tmp_path / ".new.pid").exists()


def test_output_lock_never_waits(tmp_path):
    with output_lock(tmp_path / "out"):
        started = time.monotonic()
        with pytest.raises(BebopError, match=f"pid {os.getpid()}"), output_lock(tmp_path / "out"):
            pass
        assert time.monotonic() - started < 5
    with output_lock(tmp_path / "out"):  # released: taken again
        pass


# ------------------------------------------------------------------------------------------------- disk full
@pytest.fixture
def small_fs(tmp_path):
    """A tmpfs of 4 MiB at tmp_path/fs, or a skip where this process may not mount one (not root, no
    CAP_SYS_ADMIN). ``fill(free)`` leaves about ``free`` bytes."""
    mount = tmp_path / "fs"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")

    def fill(free: int) -> None:
        stat = os.statvfs(mount)
        (mount / ".filler").write_bytes(b"\0" * max(0, stat.f_bavail * stat.f_frsize - free))

    try:
        yield mount, fill
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _full_line(err: str) -> str:
    line = one_error_line(err)
    assert "no space left on the device while writing" in line, line
    return line


def test_disk_full_generate_import_export(plain, native, small_fs, tmp_path, capsys):
    mount, fill = small_fs
    root, _, _ = native
    fill(0)
    status, err = run(["generate", "--model", plain / "model", "--mode", "none", "--prompts", plain / "prompts.jsonl",
                       "--out", mount / "out.jsonl"], capsys)
    assert status == 2 and str(mount / "out.jsonl") in _full_line(err)
    status, err = run(["import-mtp", "--model", root / "model", "--out", mount / "head"], capsys)
    assert status == 2 and str(mount / "head") in _full_line(err)
    status, err = run(["export-mtp", "--model", root / "model", "--mtp", root / "head", "--out", mount / "served"],
                      capsys)
    assert status == 2 and str(mount / "served") in _full_line(err)
    assert sorted(p.name for p in mount.iterdir()) == [".filler"]  # nothing half-written, no empty directory


def test_disk_full_rl_keeps_the_previous_checkpoint_and_report_leaves_nothing(plain, small_fs, capsys):
    mount, fill = small_fs
    run_dir = mount / "run"
    rl = ["rl", "--model", plain / "model", "--data", plain / "prompts.jsonl", "--mode", "none", "--prompts-per-step",
          "2", "--group-size", "2", "--max-new-tokens", "3", "--save-every", "1"]
    assert run([*rl, "--steps", "1", "--out", run_dir], capsys)[0] == 0
    checkpoint = snapshot(run_dir / "checkpoint")
    fill(64 * 1024)  # room for log lines, not for a second checkpoint
    status, err = run([*rl, "--resume", run_dir, "--steps", "3"], capsys)
    assert status == 2 and str(run_dir / "checkpoint") in _full_line(err)
    assert snapshot(run_dir / "checkpoint") == checkpoint
    assert sorted(p.name for p in run_dir.iterdir() if p.name.startswith(".")) == []  # no temporary directories
    (mount / ".filler").unlink()
    assert run([*rl, "--resume", run_dir, "--steps", "3"], capsys)[0] == 0  # resumes from the intact checkpoint
    fill(0)
    status, err = run(["report", run_dir, "--out", mount / "report"], capsys)
    assert status == 2 and str(mount / "report") in _full_line(err)
    assert sorted(p.name for p in mount.iterdir()) == [".filler", "run"]  # no report directory, empty or not


def test_disk_full_train_mtp_and_pretrain_leave_nothing(plain, small_fs, capsys):
    mount, fill = small_fs
    fill(0)
    status, err = run(["train-mtp", "--model", plain / "model", "--data", plain / "data.jsonl", "--out",
                       mount / "head", "--steps", "1", "--batch-size", "2", "--speculate-k", "2"], capsys)
    assert status == 2 and _full_line(err)
    status, err = run(["pretrain", "--out", mount / "model", "--steps", "1", "--eval-problems", "1"], capsys)
    assert status == 2 and str(mount / "model") in _full_line(err)
    assert sorted(p.name for p in mount.iterdir()) == [".filler"]


def test_disk_full_with_a_patched_writer(plain, tmp_path, capsys, monkeypatch):
    """Without a small file system: torch.save fails as on a full device once the first checkpoint is complete."""
    run_dir = tmp_path / "run"
    real = torch.save

    def full_after_first_checkpoint(obj, f, *args, **kwargs):
        if (run_dir / "checkpoint" / "trainer_state.json").exists():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full_after_first_checkpoint)
    status, err = run(["rl", "--model", plain / "model", "--data", plain / "prompts.jsonl", "--mode", "none",
                       "--steps", "2", "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "3",
                       "--save-every", "1", "--out", run_dir], capsys)
    assert status == 2 and str(run_dir / "checkpoint") in _full_line(err)
    assert json.loads((run_dir / "checkpoint" / "trainer_state.json").read_text())["step"] == 1
    assert not [p for p in run_dir.iterdir() if p.name.startswith(".")]  # no temporary directory left


def test_is_disk_full_reads_every_writer_s_wording():
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
    except RuntimeError as e:
        assert is_disk_full(e)  # torch.save into a Python file
    assert is_disk_full(Exception("Error while serializing: I/O error: No space left on device (os error 28)"))
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))


# -------------------------------------------------------------------------------------------------- export copies
def test_export_mtp_copies_regular_files_only(native, tmp_path, capsys):
    root, model, _ = native
    source = tmp_path / "model"
    save_native_checkpoint("qwen3_5", model, source)
    save_word_tokenizer(source)
    secret = tmp_path / "secret.txt"
    secret.write_text("outside the model")
    (source / "notes.txt").symlink_to(secret)
    (source / "extra").mkdir()
    status, err = run(["export-mtp", "--model", source, "--mtp", root / "head", "--out", tmp_path / "served"], capsys)
    assert status == 0
    served = tmp_path / "served"
    assert not (served / "notes.txt").exists() and not (served / "extra").exists()
    assert "skipped extra (a folder), notes.txt (a symbolic link)" in err
    assert (served / "tokenizer_config.json").is_file()
    for path in served.iterdir():
        assert path.is_file() and not path.is_symlink() and path.stat().st_nlink == 1, path
    shard = next(source.glob("model-0000*.safetensors"))
    assert (served / shard.name).read_bytes() == shard.read_bytes()
    with open(served / shard.name, "r+b") as f:  # an in-place write to the export leaves the source alone
        f.write(b"\0" * 8)
    assert (served / shard.name).read_bytes() != shard.read_bytes()
