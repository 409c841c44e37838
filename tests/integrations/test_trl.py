"""TRL's GRPOTrainer with Bebop's rollout function, against TRL's own generation (tiny offline models)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from bebop.integrations.trl import BebopRollout, bebop_rollout_func  # noqa: E402
from bebop.mtp.head import MtpHead  # noqa: E402
from bebop.rollout.logprobs import policy_logprobs  # noqa: E402
from bebop.speculative import SamplingParams, generate  # noqa: E402
from bebop.check.chi2 import two_sample_chi2  # noqa: E402
from bebop.utils.errors import BebopError  # noqa: E402
from tests.helpers.models import tiny_model, tiny_tokenizer  # noqa: E402

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
EOS_ID = 2  # the tiny tokenizer's "</s>"
VOCAB = 16  # the tiny tokenizer's ids
PROMPTS = ["a b c", "d e", "f g h i", "j"]
ALPHA = 1e-3  # per chi-square test: a correct sampler fails it with probability 0.001 over random seeds
REPO = Path(__file__).resolve().parents[2]


def peaked_model(seed: int = 0, scale: float = 8.0):
    """A tiny trainable model whose next-token distributions are far from uniform (scaled lm_head)."""
    model = tiny_model("qwen3", vocab_size=VOCAB, seed=seed, eos_token_id=EOS_ID)
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    for p in model.parameters():
        p.requires_grad_(True)
    return model.train()


def length_reward(completions, **_):
    return [float(len(c)) for c in completions]


def make_trainer(tmp_path, model, rollout_func=None, num_prompts: int = 4, generations: int = 4, **config):
    args = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=generations, num_generations=generations,
                max_completion_length=6, max_steps=1, logging_steps=1, report_to=[], save_strategy="no",
                use_cpu=True, seed=0, bf16=False, learning_rate=1e-3)
    args.update(config)
    data = Dataset.from_dict({"prompt": (PROMPTS * num_prompts)[:num_prompts]})
    return GRPOTrainer(model=model, reward_funcs=length_reward, args=GRPOConfig(**args), train_dataset=data,
                       processing_class=tiny_tokenizer(), rollout_func=rollout_func)


def trl_completions(trainer, prompts) -> list[list[int]]:
    """The trainer's generation path (``_generate``): TRL's own, or the rollout function it was given."""
    return [list(map(int, c)) for c in trainer._generate(list(prompts))[1]]


GREEDY = dict(generation_kwargs={"do_sample": False})
TOP_TOKEN = dict(top_p=0.0)  # sampling that keeps only the most likely token (transformers keeps one)


@pytest.mark.parametrize("chat, greedy", [(False, GREEDY), (True, GREEDY), (False, TOP_TOKEN)],
                         ids=["greedy", "greedy-chat", "top_p=0"])
def test_greedy_matches_trl_generation(tmp_path, chat, greedy):
    """T = 0 (do_sample=False), and top_p = 0 (which TRL's generate reads as "the most likely token"): Bebop's
    rs rollouts are TRL's own completions, token for token, for plain and chat (templated) prompts."""
    model = peaked_model()
    head = MtpHead(model)
    prompts = [[{"role": "user", "content": p}] if chat else p for p in PROMPTS for _ in range(2)]
    ours = trl_completions(make_trainer(tmp_path, model, bebop_rollout_func(head, mode="rs", speculate_k=3),
                                        **greedy), prompts)
    theirs = trl_completions(make_trainer(tmp_path, model, **greedy), prompts)
    assert ours == theirs
    assert any(c[-1] == EOS_ID for c in ours) or all(len(c) == 6 for c in ours)


def _leading_pairs(completions: list[list[int]]) -> Counter:
    return Counter(tuple(c[:2]) for c in completions if len(c) >= 2)


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.8, "top_k": 6, "top_p": 0.9}], ids=["T1", "T0.8-k6-p0.9"])
def test_rs_samples_match_trl_sampling(tmp_path, sampling):
    """The first two tokens of Bebop's rs samples and of TRL's own sampling have one distribution, at T = 1
    and with TRL's temperature / top-k / top-p set.

    Two-sample chi-square on the (token 1, token 2) pairs (rare pairs pooled); token 2 is the first one a
    draft can decide. A correct sampler fails each case with probability ALPHA = 0.001 over random seeds
    (0.002 for both); the seeds here are fixed, so the outcome is deterministic. A deliberately wrong
    sampler must fail the same test: temperature 2 instead of TRL's 1, or top-k/top-p ignored.
    """
    model = peaked_model()
    head = MtpHead(model)
    num = 1500
    prompts = ["a b c"] * num
    torch.manual_seed(0)
    theirs = trl_completions(make_trainer(tmp_path, model, max_completion_length=2, **sampling), prompts)
    ours = trl_completions(make_trainer(tmp_path, model, bebop_rollout_func(head, mode="rs", speculate_k=2),
                                        max_completion_length=2, **sampling), prompts)
    _, dof, p_value = two_sample_chi2(_leading_pairs(ours), _leading_pairs(theirs))
    assert dof >= 3 and p_value > ALPHA
    if sampling:  # the wrong sampler ignores top-k and top-p
        wrong = make_trainer(tmp_path, model, bebop_rollout_func(head, mode="rs", speculate_k=2),
                             max_completion_length=2, temperature=sampling["temperature"])
        _, _, p_wrong = two_sample_chi2(_leading_pairs(trl_completions(wrong, prompts)), _leading_pairs(theirs))
        assert p_wrong <= ALPHA
        return

    wrong = make_trainer(tmp_path, model, bebop_rollout_func(head, mode="rs", speculate_k=2),
                         max_completion_length=2)
    wrong.generation_config.temperature = 2.0  # the rollout reads it; TRL's own sample above used 1.0
    _, _, p_wrong = two_sample_chi2(_leading_pairs(trl_completions(wrong, prompts)), _leading_pairs(theirs))
    assert p_wrong <= ALPHA


def test_rollout_returns_trl_contract_and_policy_logprobs(tmp_path):
    """One completion per (repeated) prompt, EOS ends it, logprobs are the policy's at TRL's temperature."""
    model = peaked_model()
    trainer = make_trainer(tmp_path, model, bebop_rollout_func(MtpHead(model), mode="rs"), temperature=0.7,
                           off_policy_mask_threshold=0.5)  # a setting that reads the rollout's logprobs
    prompts = [p for p in PROMPTS for _ in range(3)]
    assert bebop_rollout_func(MtpHead(model), mode="rs", logprobs=False)(prompts, trainer)["logprobs"] is None
    plain = make_trainer(tmp_path, model, temperature=0.7)  # reads no rollout logprobs: by default none are computed
    assert bebop_rollout_func(MtpHead(model), mode="rs")(prompts, plain)["logprobs"] is None
    out = trainer.rollout_func(prompts, trainer)
    assert set(out) == {"prompt_ids", "completion_ids", "logprobs"}
    assert len(out["completion_ids"]) == len(prompts) == len(out["logprobs"])
    tok = tiny_tokenizer()
    assert out["prompt_ids"] == [tok(p)["input_ids"] for p in prompts]
    for c, lp in zip(out["completion_ids"], out["logprobs"]):
        assert 1 <= len(c) <= 6 and len(lp) == len(c)
        assert EOS_ID not in c[:-1]
    row = out["prompt_ids"][0] + out["completion_ids"][0]
    with torch.no_grad():
        logits = model.eval()(torch.tensor([row])).logits[0].float() / 0.7
    n = len(out["completion_ids"][0])
    expected = torch.log_softmax(logits[-n - 1:-1], -1).gather(-1, torch.tensor(row[-n:])[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(out["logprobs"][0]), expected, atol=1e-5, rtol=1e-5)


def test_metrics_in_log_history_and_token_stats(tmp_path):
    """A GRPO step with Bebop's rollouts logs accept length, per-position acceptance, entropy and seconds."""
    model = peaked_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = make_trainer(tmp_path, model, bebop_rollout_func(MtpHead(model), mode="rs", speculate_k=2),
                           max_steps=2, temperature=0.7, top_k=5, top_p=0.95)
    trainer.train()
    rows = [r for r in trainer.state.log_history if "loss" in r]
    assert len(rows) == 2
    for r in rows:
        assert 1.0 <= r["spec/accept_length"] <= 3.0
        assert 0.0 <= r["spec/accepted_per_pos/1"] <= 1.0 and 0.0 <= r["spec/alpha_rs/2"] <= 1.0
        assert r["spec/target_entropy"] > 0 and r["spec/rollout_seconds"] > 0
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())
    lines = (tmp_path / "out" / "token_stats.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]
    first = json.loads(lines[0])
    assert len(first["position"]) == len(first["entropy"]) == len(first["alpha_rs"]) == len(first["row"]) > 0
    record = json.loads((tmp_path / "out" / "bebop_rollout.json").read_text())
    assert record["mode"] == "rs" and record["speculate_k"] == 2 and record["backend"] == "engine"
    assert record["sampling"] == {"temperature": 0.7, "top_k": 5, "top_p": 0.95, "max_new_tokens": 6,
                                  "eos_token_ids": [EOS_ID]}  # what GRPOConfig set, as the rollout read it


def test_cut_after_keeps_stats_of_kept_tokens():
    """A second EOS id ends completions early, and the statistics count only what is kept."""
    model = tiny_model("qwen3", vocab_size=VOCAB, eos_token_id=EOS_ID)
    head = MtpHead(model)
    result = generate(model, tiny_tokenizer(), [[1, 4, 5]] * 6, mtp=head,
                      sampling=SamplingParams(temperature=1.0, max_new_tokens=12),
                      spec=dataclasses.replace(bebop_rollout_func(head).spec, speculate_k=2), seed=3)
    other_eos = Counter(t for c in result.token_ids for t in c[1:]).most_common(1)[0][0]
    cut = result.cut_after({EOS_ID, other_eos}, tiny_tokenizer())
    assert all(other_eos not in c[:-1] and EOS_ID not in c[:-1] for c in cut.token_ids)
    assert sum(cut.lengths) < sum(result.lengths) and cut.lengths == [len(c) for c in cut.token_ids]
    assert cut.stats.num_generated_tokens == sum(cut.lengths)
    assert sum(t.numel() for t in cut.stats.token_entropy) == sum(cut.lengths)
    assert cut.texts == [tiny_tokenizer().decode(c, skip_special_tokens=True) for c in cut.token_ids]
    assert result.cut_after({EOS_ID}, tiny_tokenizer()) is result  # the engine already stopped there


def test_rollout_goes_through_the_rollout_seam(tmp_path, monkeypatch):
    """The TRL rollout enters the engines as `bebop rl`'s does: one backend from ``make_backend``, synced with
    the trainer's policy before every call, then ``rollout``; the module imports no engine of its own."""
    import ast

    from bebop.integrations import trl as integration
    from bebop.rollout.engine import EngineBackend

    calls = []

    class Recording(EngineBackend):
        def sync(self, model, head=None):
            calls.append(("sync", model))
            super().sync(model, head)

        def rollout(self, *args, **kwargs):
            calls.append(("rollout",))
            return super().rollout(*args, **kwargs)

    made = []
    monkeypatch.setattr(integration, "make_backend", lambda name, *a, **o: made.append(name) or Recording(*a, **o))
    model = peaked_model()
    rollout = bebop_rollout_func(MtpHead(model), mode="rs", speculate_k=2)
    trainer = make_trainer(tmp_path, model, rollout)
    for _ in range(2):
        rollout(["a b", "c"], trainer)
    assert made == ["engine"] and calls == [("sync", model), ("rollout",)] * 2
    tree = ast.parse(Path(integration.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not imported & {"bebop.speculative.engine", "bebop.speculative.auto.generate", "bebop.rollout.vllm"}


def test_policy_logprobs_pads_rows_right():
    model = tiny_model("qwen3", vocab_size=VOCAB)
    got = policy_logprobs(model, [[1, 4], [1, 5, 6, 7]], [[8, 9, 2], [10]], temperature=1.0, batch_size=2)
    for prompt, completion, lp in zip([[1, 4], [1, 5, 6, 7]], [[8, 9, 2], [10]], got):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + completion])).logits[0]
        ref = torch.log_softmax(logits[len(prompt) - 1:-1], -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(lp), ref, atol=1e-5, rtol=1e-5)


def test_generation_fields_cover_every_field_of_transformers():
    """Every GenerationConfig field has a meaning in the rollout (read, a test, or no effect): a field a newer
    transformers adds fails here, not silently in a rollout."""
    from transformers import GenerationConfig

    from bebop.integrations.trl import GENERATION_FIELDS

    assert set(GenerationConfig().to_dict()) <= set(GENERATION_FIELDS)


@pytest.mark.parametrize("config", [{}, {"temperature": 0.7, "top_k": 6, "top_p": 0.9}, TOP_TOKEN, GREEDY,
                                    {"generation_kwargs": {"top_k": None}},  # unset: transformers' default, 50
                                    {"generation_kwargs": {"epsilon_cutoff": 1.5, "top_p": 1.5}}],  # both left out
                         ids=["defaults", "T0.7-k6-p0.9", "top_p=0", "greedy", "top_k-unset", "out-of-range-off"])
def test_sampling_params_are_what_transformers_applies(tmp_path, config):
    """The settings read from the trainer are the warpers transformers' own generate builds from its config."""
    from bebop.integrations.trl import generation_config, sampling_params

    model = peaked_model()
    trainer = make_trainer(tmp_path, model, **config)
    sampling, eos_ids = sampling_params(trainer, model)
    gen = generation_config(trainer, model)
    warpers = {type(p).__name__: p for p in model._get_logits_processor(gen, device="cpu", model_kwargs={})}
    assert set(warpers) <= {"TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper"}
    temperature = warpers["TemperatureLogitsWarper"].temperature if "TemperatureLogitsWarper" in warpers else 1.0
    top_k = warpers["TopKLogitsWarper"].top_k if "TopKLogitsWarper" in warpers else 0
    top_p = warpers["TopPLogitsWarper"].top_p if "TopPLogitsWarper" in warpers else 1.0
    if top_p == 0:  # transformers keeps one token, the most likely: top-k 1
        top_k, top_p = 1, 1.0
    expected = (temperature if gen.do_sample else 0.0, top_k, top_p)
    assert (sampling.temperature, sampling.top_k, sampling.top_p) == expected
    assert sampling.max_new_tokens == 6 and eos_ids == {EOS_ID}


@pytest.mark.parametrize("config, message", [
    ({"repetition_penalty": 1.2}, "repetition_penalty=1.2"),
    ({"min_p": 0.1}, "min_p=0.1"),
    ({"generation_kwargs": {"dola_layers": "low"}}, "dola_layers='low'"),
    ({"generation_kwargs": {"max_time": 5.0}}, "max_time=5.0"),
    ({"generation_kwargs": {"num_beams": 2}}, "num_beams=2"),
    ({"generation_kwargs": {"no_repeat_ngram_size": 2, "stop_strings": ["b"]}},
     "stop_strings=['b'], no_repeat_ngram_size=2"),
    ({"generation_kwargs": {"temperature": 0.0}}, "temperature=0.0 with do_sample=True: TRL's generate refuses it"),
    ({"temperature": 0.0}, "TRL's loss divides the policy's logits by it"),
    ({"temperature": 1e-9}, "GRPOConfig temperature must be at least 0.01 (below it logits / T overflow float32), "
                            "got 1e-09: TRL's loss divides"),
    ({"generation_kwargs": {"temperature": 1e-9}}, "temperature=1e-09 with do_sample=True: temperature must be at "
                                                   "least 0.01"),
    ({"generation_kwargs": {"top_k": -1}}, "top_k=-1: TRL's generate refuses it"),
])
def test_refuses_settings_it_cannot_reproduce_before_sampling(tmp_path, config, message):
    """Each setting TRL's generate applies and Bebop cannot reproduce is refused at the first rollout, named,
    before anything is sampled or written."""
    model = peaked_model()
    rollout = bebop_rollout_func(MtpHead(model))
    trainer = make_trainer(tmp_path, model, rollout, **config)
    with pytest.raises(BebopError, match=re.escape(message)):
        rollout(["a b"], trainer)
    assert rollout.sampler is None and rollout.num_calls == 0 and not (tmp_path / "out" / "bebop_rollout.json").exists()


def test_a_field_bebop_does_not_know_is_refused_and_a_custom_entry_ignored(tmp_path, monkeypatch):
    """A GenerationConfig field missing from GENERATION_FIELDS (as one a newer transformers adds) is refused when
    set; an entry GenerationConfig does not define (generate ignores it) is not."""
    from bebop.integrations import trl as integration

    model = peaked_model()
    model.generation_config.chat_format = "chatml"  # a custom entry some checkpoints ship
    trainer = make_trainer(tmp_path, model, generation_kwargs={"low_memory": True})
    assert integration.sampling_params(trainer, model)[0].temperature == 1.0
    monkeypatch.delitem(integration.GENERATION_FIELDS, "low_memory")
    with pytest.raises(BebopError, match="low_memory=True"):
        integration.sampling_params(trainer, model)


def test_refuses_what_the_integration_cannot_run(tmp_path):
    model = peaked_model()
    trainer = make_trainer(tmp_path, model, bebop_rollout_func(MtpHead(model)))
    trainer.use_vllm = True  # TRL's own vLLM generation (which needs vLLM to build the trainer)
    with pytest.raises(BebopError, match="set use_vllm=False"):
        trainer.rollout_func(["a b"], trainer)
    trainer.use_vllm = False
    trainer.is_fsdp_enabled = True  # as accelerate sets it for an FSDP-sharded policy
    with pytest.raises(BebopError, match="whole policy"):
        trainer.rollout_func(["a b"], trainer)
    with pytest.raises(BebopError, match="needs an MTP head"):
        bebop_rollout_func(None, mode="rs")
    with pytest.raises(BebopError, match="mode"):
        bebop_rollout_func(None, mode="fast")
    assert isinstance(bebop_rollout_func(None, mode="none"), BebopRollout)
    with pytest.raises(BebopError, match="unknown backend"):
        bebop_rollout_func(None, mode="none", backend="sglang")
    with pytest.raises(BebopError, match="auto needs backend engine"):
        bebop_rollout_func(MtpHead(model), mode="rs", speculate_k="auto", backend="vllm")


LAUNCH_SCRIPT = """
import os, sys, json, torch
sys.path.insert(0, {repo!r})
os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
from tests.integrations.test_trl import make_trainer, peaked_model
from bebop.integrations.trl import bebop_rollout_func
from bebop.mtp.head import MtpHead
from pathlib import Path
torch.set_num_threads(1)
model = peaked_model()
trainer = make_trainer(Path({tmp!r}), model, bebop_rollout_func(MtpHead(model), mode="rs", speculate_k=2),
                       num_prompts=4, generations=2, per_device_train_batch_size=2, max_steps=2)
trainer.train()
if trainer.accelerator.is_main_process:
    rows = [r for r in trainer.state.log_history if "loss" in r]
    Path({tmp!r}, "history.json").write_text(json.dumps(rows))
trainer.end()  # destroys the process group: without it a gloo process may abort at exit (docs/trainers.md)
sys.stdout.flush(); sys.stderr.flush()
os._exit(0)  # no interpreter teardown, where torch's gloo can still abort a finished process (docs/trainers.md)
"""

@pytest.mark.slow
def test_two_process_accelerate_launch(tmp_path):
    """``accelerate launch`` with 2 CPU processes (gloo): each rank rolls out its prompts, metrics summed; both
    processes exit 0 (the script ends with ``trainer.end()``, as docs/trainers.md says a script should)."""
    script = tmp_path / "train.py"
    script.write_text(LAUNCH_SCRIPT.format(repo=str(REPO), tmp=str(tmp_path)))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    # NOTE: ``--cpu`` with 2 processes needs MPI; ``--multi_gpu`` launches through torchrun, and the trainer's
    # use_cpu=True makes accelerate pick MULTI_CPU with gloo.
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", str(script)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads((tmp_path / "history.json").read_text())
    assert len(rows) == 2 and all(1.0 <= r["spec/accept_length"] <= 3.0 for r in rows)
    stats = [json.loads(line) for line in (tmp_path / "out" / "token_stats.jsonl").read_text().splitlines()]
    assert len(stats) == 2
    assert min(stats[0]["row"]) < 2 <= max(stats[0]["row"])  # both ranks' rows, the second's offset past the first's


def test_train_head_on_policy_then_roll_out(tmp_path):
    """One call trains a head on the policy's samples; the rollout loads it from its path; the policy trains on."""
    from bebop.integrations.trl import train_head_on_policy
    from bebop.mtp.config import TrainMtpConfig

    model = peaked_model()
    head_dir = tmp_path / "head"
    trainer = make_trainer(tmp_path, model, bebop_rollout_func(str(head_dir), mode="rs", speculate_k=2))
    cfg = TrainMtpConfig(steps=2, batch_size=4, speculate_k=2, save_every=0)
    assert train_head_on_policy(trainer, head_dir, num_prompts=4, samples_per_prompt=2, config=cfg) == head_dir
    assert (head_dir / "mtp_config.json").is_file()
    assert json.loads((head_dir / "mtp_config.json").read_text())["train"]["loss"] == "e2e_tv"
    assert all(p.requires_grad for p in model.parameters()) and model.training
    out = trainer.rollout_func(["a b c"] * 4, trainer)
    assert len(out["completion_ids"]) == 4 and trainer._metrics["train"]["spec/accept_length"]


@pytest.mark.parametrize("mode", ["rs", "auto"])
def test_auto_keeps_its_chooser_and_logs_each_choice(tmp_path, mode):
    """speculate_k="auto": the chooser lives across calls; TRL's metrics record the mode and K each rollout ran
    (one key per mode: their average over a logging window is the share of rollouts in that mode), and the
    per-position metrics of every depth drafted."""
    from bebop.config import AUTO_MAX_K
    from bebop.speculative.settings import MODES

    model = peaked_model()
    rollout = bebop_rollout_func(MtpHead(model), mode=mode, speculate_k="auto")
    trainer = make_trainer(tmp_path, model, rollout)
    for _ in range(2):
        rollout(["a b c", "d e"] * 4, trainer)
    metrics = trainer._metrics["train"]
    assert rollout.sampler.chooser is not None and len(metrics["spec/accept_length"]) == 2
    shares = [[metrics[f"auto/mode/{m}"][i] for m in MODES] for i in range(2)]
    assert all(sorted(s) == [0.0] * (len(MODES) - 1) + [1.0] for s in shares)
    if mode == "rs":
        assert metrics["auto/mode/rs"] == [1.0, 1.0]
    assert all(0 <= k <= AUTO_MAX_K and (k > 0) == (metrics["auto/mode/none"][i] == 0.0)
               for i, k in enumerate(metrics["auto/speculate_k"]))
    assert all(f"spec/alpha_rs/{j}" in metrics for j in range(1, AUTO_MAX_K + 1))  # the first call probes every K
    assert f"spec/alpha_rs/{AUTO_MAX_K + 1}" not in metrics


def test_rollout_under_several_processes_refuses_auto(tmp_path, monkeypatch):
    """Mode/K auto under several processes is refused before sampling (each would time, hence choose, alone)."""
    model = peaked_model()
    rollout = bebop_rollout_func(MtpHead(model), mode="rs", speculate_k="auto")
    trainer = make_trainer(tmp_path, model, rollout)
    monkeypatch.setattr(type(trainer.accelerator), "num_processes", property(lambda self: 2))
    with pytest.raises(BebopError, match="auto does not run under torchrun or accelerate launch"):
        rollout(["a b"], trainer)
    assert rollout.sampler is None
