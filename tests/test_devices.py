"""Devices and dtypes: --device/--dtype on every command that loads a model, float32 statistics
whatever the weights' dtype, float32 master weights for bfloat16 training, and the CUDA paths.

bfloat16 runs on a CPU here (slowly, on tiny models); the tests marked ``cuda`` skip without a GPU
and run with ``bench/gpu_smoke.sh`` on a GPU machine.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from bebop.cli import main
from bebop.mtp import MtpHead
from bebop.mtp.train import TrainMtpConfig, train_mtp
from bebop.rollout.logprobs import token_logprobs
from bebop.speculative.engine import SamplingParams, SpecConfig, generate
from bebop.speculative.sampling import logits_to_probs
from bebop.speculative.verification import VERIFIERS
from bebop.utils.errors import BebopError
from bebop.utils.optim import MasterWeightAdamW, make_adamw, master_state_dict
from bebop.utils.torch_utils import resolve_dtype
from tests.helpers.cli import save_model_dir
from tests.helpers.engine import GREEDY_LENGTHS, VOCAB, ToyTokenizer, perturbed_head, toy_prompts
from tests.helpers.models import random_sequences, tiny_model

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run bench/gpu_smoke.sh on one)")
BF16 = torch.bfloat16


def _bf16_model(arch: str = "qwen3", **kwargs):
    return tiny_model(arch, **kwargs).to(BF16)


# ---------------------------------------------------------------------------------------------- resolution


def test_resolve_dtype_auto_is_float32_on_cpu_and_names_map():
    assert resolve_dtype("auto", "cpu") == resolve_dtype(None, torch.device("cpu")) == torch.float32
    assert resolve_dtype("float32", "cpu") == torch.float32 and resolve_dtype("bfloat16") == BF16
    assert resolve_dtype(BF16) == BF16


@pytest.mark.parametrize("name", ["float16", "fp16", "half", "int8", torch.float16])
def test_unsupported_dtype_is_one_clear_line(name):
    with pytest.raises(BebopError, match=r"^unsupported dtype '(float16|fp16|half|int8)'; use auto, float32"):
        resolve_dtype(name, "cpu")


# ---------------------------------------------------------------------------------------------- master weights


def test_master_weights_keep_updates_that_bfloat16_rounds_away():
    """The defect master weights fix: AdamW's step (~lr per step) on a bf16 weight of 1.0 is below half
    a bf16 ulp (2^-8), so plain AdamW never moves it; through float32 masters 60 steps of 1e-4 add up."""
    plain = torch.nn.Parameter(torch.ones(4, dtype=BF16))
    mixed = torch.nn.Parameter(torch.ones(4, dtype=BF16))
    opts = [torch.optim.AdamW([plain], lr=1e-4, weight_decay=0.0), make_adamw([mixed], lr=1e-4, weight_decay=0.0)]
    assert isinstance(opts[1], MasterWeightAdamW)
    for _ in range(60):
        for p, opt in zip((plain, mixed), opts):
            opt.zero_grad()
            p.grad = torch.ones_like(p)
            opt.step()
    assert torch.equal(plain, torch.ones(4, dtype=BF16)), "plain bf16 AdamW was expected to lose every update"
    master = opts[1].masters[0]
    assert master.dtype == torch.float32 and torch.allclose(master, torch.full((4,), 1 - 60e-4), atol=1e-5)
    assert torch.equal(mixed, master.to(BF16)) and (mixed < 1).all()


def test_make_adamw_is_plain_adamw_for_float32():
    assert type(make_adamw([torch.nn.Parameter(torch.ones(2))], lr=1e-3)) is torch.optim.AdamW


def test_master_weights_resume_bit_for_bit_and_save_float32():
    """A resumed optimizer continues from the masters (not from the rounded weights); a bf16 module's
    ``master_state_dict`` holds the float32 masters, tied weights included."""
    def run(steps, model, opt):
        for s in range(steps):
            opt.zero_grad()
            x = torch.randn(3, 8, generator=torch.Generator().manual_seed(s)).to(BF16)
            model(x).float().square().sum().backward()
            opt.step()

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)).to(BF16)
    model[1].weight = model[0].weight  # tied
    twin = copy.deepcopy(model)
    opt = make_adamw(model.parameters(), lr=1e-3)
    run(3, model, opt)
    state = copy.deepcopy(opt.state_dict())  # as torch.save + torch.load would
    resumed_model = copy.deepcopy(twin)
    resumed = make_adamw(resumed_model.parameters(), lr=1e-3)
    run(3, resumed_model, make_adamw(resumed_model.parameters(), lr=1e-3))  # diverges from the masters...
    resumed.load_state_dict(state)  # ...until the checkpoint puts masters and weights back
    run(2, model, opt)
    run(2, resumed_model, resumed)
    assert all(torch.equal(a, b) for a, b in zip(opt.masters, resumed.masters))
    saved = master_state_dict(model, opt)
    assert all(t.dtype == torch.float32 for t in saved.values())
    tied = saved["0.weight"]
    assert saved["1.weight"] is tied and not torch.equal(tied.to(BF16).float(), tied)  # unrounded masters
    with pytest.raises(ValueError, match="not a MasterWeightAdamW state"):
        resumed.load_state_dict(torch.optim.AdamW(twin.parameters()).state_dict())


# ---------------------------------------------------------------------------------------------- fp32 statistics


def test_sampling_probabilities_of_bfloat16_logits_are_float32():
    """softmax of bf16 logits is computed after the upcast: to 1e-6 the float32 softmax of the same
    values (a bf16 softmax errs by ~4e-3 relative, and would also return bf16)."""
    logits = (torch.randn(4, 1000, generator=torch.Generator().manual_seed(0)) * 3).to(BF16)
    for kwargs in ({}, {"top_k": 50}, {"top_p": 0.9}):
        probs = logits_to_probs(logits, 0.7, **kwargs)
        reference = logits_to_probs(logits.float(), 0.7, **kwargs)
        assert probs.dtype == torch.float32 and torch.allclose(probs, reference, rtol=1e-6, atol=1e-9)


def test_engine_verifies_bfloat16_models_with_float32_p_and_q(monkeypatch):
    """The p and q that rejection sampling compares (min(1, p/q), max(0, p - q)) and the weights the
    emitted token is drawn from are float32 for a bf16 model: the engine upcasts the logits before its
    softmaxes."""
    seen = []
    verify = VERIFIERS["token"]

    def spy(p, drafts, q, uniform):
        num_accepted, weights = verify(p, drafts, q, uniform)
        seen.append((p.dtype, q.dtype, weights.dtype))
        return num_accepted, weights

    monkeypatch.setitem(VERIFIERS, "token", spy)  # looked up when the engine's runner is built
    model = _bf16_model(vocab_size=VOCAB)
    out = generate(model, ToyTokenizer(), toy_prompts((3, 5)), mtp=perturbed_head(model, 0.3), seed=0,
                   sampling=SamplingParams(temperature=1.0, max_new_tokens=8), spec=SpecConfig("rs", 3))
    assert seen and set(seen) == {(torch.float32, torch.float32, torch.float32)}
    alphas = out.stats.token_arrays()["alpha_rs"]
    assert alphas.dtype == torch.float32 and ((alphas > 0) & (alphas <= 1)).all()


def test_policy_logprobs_of_a_bfloat16_model_are_float32():
    """GRPO's log-probs: log_softmax of the upcast logits, exactly (a bf16 log-softmax would be bf16 and
    off by ~1e-2 nats)."""
    model = _bf16_model(vocab_size=64)
    ids = torch.randint(1, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    attn, comp = torch.ones_like(ids), torch.ones_like(ids, dtype=torch.bool)
    got = token_logprobs(model, ids, attn, comp, temperature=0.7)
    logits = model(input_ids=ids).logits.float() / 0.7
    expected = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]
    assert got.dtype == torch.float32 and torch.allclose(got[:, 1:], expected, atol=1e-5)


# ---------------------------------------------------------------------------------------------- bf16 on CPU


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_bfloat16_greedy_speculative_equals_plain(arch):
    """Temperature 0 stays exact in bf16: the verify pass over K+1 tokens and the plain pass agree."""
    model = _bf16_model(arch, vocab_size=VOCAB)
    head = MtpHead(model)
    assert next(head.parameters()).dtype == BF16  # the head follows its backbone
    prompts = toy_prompts(GREEDY_LENGTHS)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=20)
    plain = generate(model, ToyTokenizer(), prompts, sampling=greedy)
    for mode in ("to", "rs"):
        for k in (1, 3):
            out = generate(model, ToyTokenizer(), prompts, mtp=head, sampling=greedy, spec=SpecConfig(mode, k))
            assert out.token_ids == plain.token_ids, (mode, k)
            assert 0 < out.stats.num_accepted_tokens < out.stats.num_draft_tokens, (mode, k)


def test_bfloat16_head_trains_through_float32_masters_and_saves_float32(tmp_path):
    model = _bf16_model()
    head0 = MtpHead(model)
    cfg = TrainMtpConfig(loss="e2e_tv", ce_warmup=1, steps=3, batch_size=4, speculate_k=2, save_every=0, lr=1e-3)
    head = train_mtp(model, random_sequences(), tmp_path, cfg, show_progress=False)
    assert all(p.dtype == BF16 for p in head.parameters())
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        saved = {k: f.get_tensor(k) for k in f.keys()}
    assert {t.dtype for t in saved.values()} == {torch.float32}
    # NOTE: every master moved; the norm weights (~1, 3 steps of lr <= 3e-4) move less than half a bf16 ulp,
    # so their bf16 copies did not: the updates that bfloat16 AdamW would have dropped.
    initial = head0.state_dict()
    assert all(not torch.equal(saved[k], initial[k].float()) for k in saved)
    assert any(torch.equal(p, initial[k]) for k, p in head.state_dict().items())
    loaded = MtpHead.from_pretrained(tmp_path, model)
    assert all(torch.equal(p, q) for p, q in zip(loaded.parameters(), head.parameters()))


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A tiny Llama with its tokenizer and a prompt file, as the current directory."""
    save_model_dir(tmp_path / "model", tiny_model("llama", vocab_size=16))
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("a b", "c d e")))
    (tmp_path / "text.jsonl").write_text("".join(json.dumps({"text": " ".join("abcdefghijkl"[i:] + "abc")}) + "\n"
                                                 for i in range(6)))
    (tmp_path / "rewards.py").write_text("def score(prompts, completions, **_):\n"
                                         "    return [float(len(c)) for c in completions]\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_bfloat16_on_cpu_end_to_end(workdir, capsys):
    """train-mtp, eval-mtp, generate and rl (online head) with --dtype bfloat16 on a CPU; rl records the
    dtype and a resume keeps it (and refuses another)."""
    gen = ["generate", "--model", "model", "--prompts", "prompts.jsonl", "--max-new-tokens", "6", "--dtype", "bfloat16"]
    assert main([*gen, "--mode", "none", "--out", "plain.jsonl"]) == 0
    assert main(["train-mtp", "--model", "model", "--data", "text.jsonl", "--out", "head", "--steps", "2",
                 "--batch-size", "2", "--speculate-k", "2", "--dtype", "bfloat16", "--device", "cpu"]) == 0
    with safe_open(workdir / "head" / "model.safetensors", "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float32}
    assert main(["eval-mtp", "--model", "model", "--mtp", "head", "--data", "text.jsonl", "--speculate-k", "2",
                 "--dtype", "bfloat16", "--json", "eval.json"]) == 0
    assert json.loads((workdir / "eval.json").read_text())["num_positions"] > 0
    assert main([*gen, "--mtp", "head", "--mode", "rs", "--out", "rs.jsonl", "--stats-json", "stats.json"]) == 0
    assert json.loads((workdir / "stats.json").read_text())["spec/num_drafts"] > 0
    rl = ["--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "4", "--reward", "rewards:score"]
    assert main(["rl", "--model", "model", "--mtp", "head", "--data", "prompts.jsonl", "--steps", "1", "--out", "run",
                 "--mode", "rs", "--mtp-update", "online", "--dtype", "bfloat16", *rl]) == 0
    assert json.loads((workdir / "run" / "config.json").read_text())["dtype"] == "bfloat16"
    row = json.loads((workdir / "run" / "metrics.jsonl").read_text())
    assert all(torch.isfinite(torch.tensor(row[k])) for k in ("rl/loss", "mtp/loss"))  # policy and online head
    capsys.readouterr()
    assert main(["rl", "--resume", "run", "--steps", "2", "--dtype", "float32", "--reward", "rewards:score"]) == 2
    assert "dtype: 'bfloat16' -> None" in capsys.readouterr().err
    assert main(["rl", "--resume", "run", "--steps", "2", "--reward", "rewards:score"]) == 0
    assert len((workdir / "run" / "metrics.jsonl").read_text().splitlines()) == 2


def test_bfloat16_commands_find_the_embedded_cache_by_its_float32_weights(tmp_path, monkeypatch, capsys):
    """Cached heads and data are keyed by the float32 weights' SHA-256: a bf16 command must look them up
    on the float32 model (then cast it), or it would rebuild the cache (minutes) under another key."""
    from bebop import embedded
    from bebop.mtp.data import Sequences

    model = tiny_model("llama", vocab_size=16)
    save_model_dir(embedded.embedded_model_dir(), model)
    MtpHead(model).save_pretrained(tmp_path / "head")
    seen = []

    def head(loss, model, tok):
        seen.append(("head", model.dtype))
        return tmp_path / "head"

    def data(split, model, tok, num=None):
        seen.append(("data", model.dtype))
        return Sequences([[1, 4, 5, 6, 7, 8, 9, 10]] * 4, [2] * 4)

    def evaluate(backbone, mtp, *args, **kwargs):
        seen.append(("eval", backbone.dtype, next(mtp.parameters()).dtype))
        return evaluate_mtp(backbone, mtp, *args, **kwargs)

    from bebop.mtp import evaluate as evaluate_module

    evaluate_mtp = evaluate_module.evaluate_mtp
    monkeypatch.setattr(evaluate_module, "evaluate_mtp", evaluate)
    monkeypatch.setattr(embedded, "ensure_embedded_head", head)
    monkeypatch.setattr(embedded, "embedded_data", data)
    assert main(["eval-mtp", "--dtype", "bfloat16", "--speculate-k", "2"]) == 0
    assert seen == [("head", torch.float32), ("data", torch.float32), ("eval", BF16, BF16)]
    assert "| e2e_tv |" in capsys.readouterr().out


def test_pretrain_in_bfloat16_saves_float32_masters(tmp_path):
    assert main(["pretrain", "--out", str(tmp_path / "m"), "--steps", "3", "--eval-problems", "2",
                 "--dtype", "bfloat16", "--device", "cpu"]) == 0
    with safe_open(tmp_path / "m" / "model.safetensors", "pt") as f:
        weights = [f.get_tensor(k) for k in f.keys()]
    assert {t.dtype for t in weights} == {torch.float32}
    assert any(not torch.equal(t.to(BF16).float(), t) for t in weights)
    assert json.loads((tmp_path / "m" / "pretrain.json").read_text())["config"]["dtype"] == "bfloat16"


COMMANDS = {  # every command that loads a model, with arguments that get it as far as loading
    "generate": ["generate", "--model", "model", "--out", "out.jsonl"],
    "train-mtp": ["train-mtp", "--model", "model", "--data", "prompts.jsonl", "--out", "new-head"],
    "eval-mtp": ["eval-mtp", "--model", "model", "--mtp", "head", "--data", "prompts.jsonl"],
    "check-lossless": ["check-lossless", "--model", "model", "--mtp", "head"],
    "rl": ["rl", "--model", "model", "--data", "prompts.jsonl", "--out", "run", "--mode", "none",
           "--reward", "rewards:score"],
    "import-mtp": ["import-mtp", "--model", "model", "--out", "new-head"],
    "pretrain": ["pretrain", "--out", "new-model"],
    "demo": ["demo", "--quick", "--out", "demo-out"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("flags, message", [(["--dtype", "float16"], "unsupported dtype 'float16'"),
                                            (["--device", "cuda"], "CUDA is not available")])
def test_bad_device_or_dtype_is_one_line_on_every_command(workdir, capsys, command, flags, message):
    if "cuda" in flags and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main([*COMMANDS[command], *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("bebop: error: ") and message in err[-1] and "Traceback" not in "\n".join(err)
    assert not any((workdir / name).exists() for name in ("out.jsonl", "new-head", "run", "new-model", "demo-out"))
    assert not list(Path(workdir).glob("*.old-*"))


def test_every_model_command_has_device_and_dtype_flags():
    from bebop.cli import build_parser

    commands = build_parser()._subparsers._group_actions[0].choices
    for name in [*COMMANDS, "export-mtp"]:
        help_text = commands[name].format_help()
        assert "--device" in help_text and "--dtype" in help_text, name


# ---------------------------------------------------------------------------------------------- CUDA


@cuda
def test_cuda_auto_is_bfloat16_where_supported():
    assert resolve_dtype("auto", "cuda") == (BF16 if torch.cuda.is_bf16_supported() else torch.float32)


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, BF16])
def test_cuda_greedy_speculative_equals_plain(dtype):
    model = tiny_model("qwen3", vocab_size=VOCAB).to("cuda", dtype)
    head = MtpHead(model)
    assert next(head.parameters()).device.type == "cuda" and next(head.parameters()).dtype == dtype
    prompts = toy_prompts(GREEDY_LENGTHS)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=20)
    plain = generate(model, ToyTokenizer(), prompts, sampling=greedy)
    for mode, k in (("to", 2), ("rs", 3)):
        out = generate(model, ToyTokenizer(), prompts, mtp=head, sampling=greedy, spec=SpecConfig(mode, k))
        assert out.token_ids == plain.token_ids, (mode, k)


@cuda
def test_cuda_bfloat16_train_mtp_step(tmp_path):
    model = tiny_model("qwen3").to("cuda", BF16)
    head0 = MtpHead(model)
    cfg = TrainMtpConfig(loss="e2e_tv", ce_warmup=1, steps=3, batch_size=4, speculate_k=2, save_every=0, lr=1e-3)
    head = train_mtp(model, random_sequences(), tmp_path, cfg, show_progress=False)
    assert next(head.parameters()).device.type == "cuda"
    assert all(not torch.equal(a, b) for a, b in zip(head0.parameters(), head.parameters()))
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)


@cuda
def test_cuda_bfloat16_rl_step(workdir):
    assert main(["rl", "--model", "model", "--data", "prompts.jsonl", "--steps", "2", "--out", "run", "--mode", "none",
                 "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "4", "--reward", "rewards:score",
                 "--device", "cuda", "--dtype", "bfloat16"]) == 0
    rows = [json.loads(line) for line in (workdir / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(torch.isfinite(torch.tensor(r["rl/loss"])) for r in rows)
