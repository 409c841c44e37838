"""What Bebop does around vLLM, tested without vLLM: the probe and repair of the CPU expand fallback
(in this process and in the processes started after it), the torchvision stand-in, vLLM's log file,
and the one line a failed start or generate ends in (on a fake vLLM module)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from bebop.rollout import vllm_cpu_fix, vllm_process
from bebop.rollout import vllm as vllm_backend
from bebop.rollout.vllm import VllmBackend
from bebop.speculative import SamplingParams, SpecConfig
from bebop.utils.errors import BebopError

ROOT = Path(__file__).resolve().parents[2]
DEFECTIVE_SOURCE = '''
import torch

def _expand_kernel_impl(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
    """vllm-cpu 0.32.0's mistake: the values are written into an int64 copy of the output."""
    copy = output.to(torch.int64)
    copy.fill_(0)
'''


def _defective_module():
    module = types.ModuleType("fake_cpu_triton_utils")
    exec(DEFECTIVE_SOURCE, module.__dict__)  # noqa: S102 - this file's own source text
    return module


def test_expand_per_token_by_hand():
    out = torch.full((6,), -1.0)
    vllm_cpu_fix._expand_per_token(out, torch.tensor([0.7, 0.0, 1.0]), torch.tensor([2, 2, 5], dtype=torch.int32), 0, 9)
    assert out.tolist() == pytest.approx([0.7, 0.7, 1.0, 1.0, 1.0, -1.0])  # request 1 has no tokens; slot 5 unused
    ints = torch.full((4,), -1, dtype=torch.int32)
    vllm_cpu_fix._expand_per_token(ints, torch.tensor([0, 5], dtype=torch.int32), torch.tensor([1, 4]), 0, 50)
    assert ints.tolist() == [50, 5, 5, 5]  # top-k 0 (off) expands to the replacement


def test_probe_finds_the_defect_and_the_repair_passes_it():
    module = _defective_module()
    assert vllm_cpu_fix.probe(module) is False
    assert vllm_cpu_fix._patch(module)
    assert vllm_cpu_fix.probe(module) is True
    assert vllm_cpu_fix.probe(types.ModuleType("no_fallback")) is None


@pytest.mark.parametrize("probes, flag, expected, applied", [
    ([None], None, vllm_cpu_fix.NOT_USED, False),
    ([True], None, vllm_cpu_fix.CORRECT, False),
    ([False, True], None, vllm_cpu_fix.REPAIRED, True),
    ([False, False], None, vllm_cpu_fix.DEFECTIVE, True),  # the replacement did not take
    ([False], "0", vllm_cpu_fix.DEFECTIVE, False),  # the user keeps vLLM as installed
])
def test_decide_follows_what_the_probe_finds(monkeypatch, probes, flag, expected, applied):
    answers, calls = iter(probes), []
    monkeypatch.setattr(vllm_cpu_fix, "probe", lambda: next(answers))
    monkeypatch.setattr(vllm_cpu_fix, "apply", lambda: calls.append(1) or True)
    environ = {} if flag is None else {vllm_cpu_fix.ENV_FLAG: flag}
    assert vllm_process.prepare_sampling(environ) == expected
    assert bool(calls) == applied
    if expected == vllm_cpu_fix.REPAIRED:  # every later process repairs on import
        assert environ[vllm_cpu_fix.ENV_FLAG] == "1"
        assert environ["PYTHONPATH"].split(os.pathsep)[0] == str(vllm_cpu_fix.site_dir())
    else:
        assert "PYTHONPATH" not in environ


def test_refusal_is_one_line_naming_the_defect_unless_the_user_keeps_it():
    line = vllm_process.refusal(vllm_cpu_fix.DEFECTIVE, {})
    assert line and "\n" not in line and "_expand_kernel_impl" in line and "--backend engine" in line
    assert vllm_process.refusal(vllm_cpu_fix.DEFECTIVE, {vllm_cpu_fix.ENV_FLAG: "0"}) is None
    for found in (vllm_cpu_fix.NOT_USED, vllm_cpu_fix.CORRECT, vllm_cpu_fix.REPAIRED):
        assert vllm_process.refusal(found, {}) is None


def _python(code: str, env: dict, tmp_path: Path) -> str:
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_a_process_started_after_the_repair_repairs_itself(tmp_path):
    """A fake ``vllm.utils.cpu_triton_utils`` holding the defect, imported by a new interpreter: the
    environment ``child_env`` gives makes it correct; the same interpreter without it keeps the defect."""
    fake = tmp_path / "fake"
    (fake / "vllm" / "utils").mkdir(parents=True)
    (fake / "vllm" / "__init__.py").write_text("")
    (fake / "vllm" / "utils" / "__init__.py").write_text("")
    (fake / "vllm" / "utils" / "cpu_triton_utils.py").write_text(DEFECTIVE_SOURCE)
    code = ("import vllm.utils.cpu_triton_utils as m; from bebop.rollout.vllm_cpu_fix import probe; "
            "print(probe(m))")
    base = {k: v for k, v in os.environ.items() if k != vllm_cpu_fix.ENV_FLAG}
    base["PYTHONPATH"] = os.pathsep.join([str(fake), str(ROOT)])
    assert _python(code, base, tmp_path) == "False"
    assert _python(code, {**base, **vllm_cpu_fix.child_env(base)}, tmp_path) == "True"


@pytest.fixture
def no_torchvision(monkeypatch):
    """``import torchvision`` fails here; sys.path and torchvision's modules are restored afterwards."""
    saved = {name: m for name, m in sys.modules.items() if name == "torchvision" or name.startswith("torchvision.")}
    for name in saved:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torchvision", None)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
        del sys.modules[name]
    sys.modules.update(saved)


def test_torchvision_stand_in_goes_on_the_path_when_the_import_fails(no_torchvision, tmp_path):
    environ = {"PYTHONPATH": "/elsewhere"}
    assert vllm_process.provide_torchvision(environ)
    assert sys.path[0] == str(vllm_process.STANDIN_DIR)
    assert environ["PYTHONPATH"] == os.pathsep.join([str(vllm_process.STANDIN_DIR), "/elsewhere"])
    from torchvision.transforms.v2 import functional  # what transformers' Qwen2-VL image processor imports

    with pytest.raises(RuntimeError, match="torchvision is not installed"):
        functional.resize()
    env = {**os.environ, "PYTHONPATH": environ["PYTHONPATH"]}  # vLLM's inspection subprocess sees it too
    assert _python("import torchvision; print(torchvision.__version__)", env, tmp_path) == "0.0.0+bebop.standin"


@pytest.mark.parametrize("error, wanted", [
    (ValueError("Model architectures ['Qwen3_5ForCausalLM'] failed to be inspected"),
     ["module torchvision is missing", "pip install torchvision"]),  # the cause is chained below, as vLLM raises it
    (RuntimeError("Unsupported CPU attention configuration: head_dim=16"), ["head size 16", "--backend engine"]),
    (ValueError("No available memory for the cache blocks. Try increasing `gpu_memory_utilization`"),
     ["no memory left for vLLM's KV cache", "VLLM_CPU_KVCACHE_SPACE"]),
    (RuntimeError("engine core died\nEngineCore failed: something new"), ["EngineCore failed: something new"]),
])
def test_failure_line_names_cause_and_remedy_in_one_line(tmp_path, error, wanted):
    if "inspected" in str(error):
        try:
            raise error from ModuleNotFoundError("No module named 'torchvision'")
        except ValueError as e:
            error = e
    line = vllm_process.failure_line(error, tmp_path / "vllm.log")
    assert "\n" not in line and line.startswith("vLLM could not start: ")
    assert all(w in line for w in wanted), line
    assert line.endswith(f"vLLM's log: {tmp_path / 'vllm.log'}")


def test_failure_line_finds_the_cause_in_the_log(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text("INFO loading\nERROR Traceback ...\nModuleNotFoundError: No module named 'flash_attn.ops'\n")
    line = vllm_process.failure_line(ValueError("1 validation error for ModelConfig\n  Value error"), log)
    assert "module flash_attn.ops is missing" in line and "pip install flash_attn" in line


# ---------------------------------------------------------------------------------------------- a fake vLLM
class _FakeLLM:
    """Starts, or fails the way vLLM does (logging the cause, then raising a generic error)."""

    fail_start = False
    llm_engine = types.SimpleNamespace(engine_core=types.SimpleNamespace(shutdown=lambda: None))

    started_with: dict = {}  # the last start's arguments

    def __init__(self, **kwargs):
        _FakeLLM.started_with = kwargs
        if self.fail_start:
            logging.getLogger("vllm.registry").error("No module named 'xformers'")
            raise ValueError("1 validation error for ModelConfig\n  Model architectures ['X'] failed to be inspected")

    def collective_rpc(self, fn, args=()):
        pass

    def reset_prefix_cache(self):
        pass

    def get_metrics(self):
        return []

    def generate(self, prompts, params, use_tqdm=False):
        raise RuntimeError("Unsupported CPU attention configuration: head_dim=16")


def _fake_backend(monkeypatch, tmp_path, found=vllm_cpu_fix.NOT_USED):
    fake = types.ModuleType("vllm")
    fake.LLM, fake.SamplingParams = _FakeLLM, lambda **kw: kw
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(vllm_backend._LIVE, "llm", None)  # the fake engine does not outlive the test
    monkeypatch.setattr(vllm_process, "provide_torchvision", lambda: False)
    monkeypatch.setattr(vllm_process, "prepare_sampling", lambda: found)
    monkeypatch.setattr(VllmBackend, "_model_dir", lambda self, mode: tmp_path)
    monkeypatch.delenv("VLLM_LOGGING_CONFIG_PATH", raising=False)
    monkeypatch.setenv("VLLM_CONFIGURE_LOGGING", "1")  # log_to_file sets it to 0; restored afterwards
    model = torch.nn.Linear(2, 2)
    model.config = types.SimpleNamespace(get_text_config=lambda: types.SimpleNamespace(max_position_embeddings=64,
                                                                                     num_hidden_layers=1))
    tokenizer = types.SimpleNamespace(encode=lambda text: [1, 2], decode=lambda ids, **kw: "")
    return VllmBackend(model, tokenizer, workdir=tmp_path / "work")


@pytest.fixture
def vllm_logger():
    """The ``vllm`` logger's handlers and propagation, restored after the test."""
    logger = logging.getLogger("vllm")
    saved = (list(logger.handlers), logger.propagate, logger.level)
    yield logger
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    for handler in saved[0]:
        logger.addHandler(handler)
    logger.propagate, logger.level = saved[1], saved[2]


def test_a_failed_start_is_one_line_and_vllms_log_is_a_file(monkeypatch, tmp_path, vllm_logger, capsys):
    monkeypatch.setattr(_FakeLLM, "fail_start", True)
    backend = _fake_backend(monkeypatch, tmp_path)
    assert backend.log_path is None and not (tmp_path / "work").exists()  # nothing written before an engine starts
    with pytest.raises(BebopError) as caught:
        backend.rollout([[1, 2]], SamplingParams(max_new_tokens=4), SpecConfig("none"))
    assert backend.log_path == tmp_path / "work" / vllm_process.LOG_NAME and os.environ["VLLM_CONFIGURE_LOGGING"] == "0"
    line = str(caught.value)
    assert "\n" not in line and "module xformers is missing" in line and str(backend.log_path) in line
    assert "No module named 'xformers'" in backend.log_path.read_text()
    assert "xformers" not in capsys.readouterr().err  # the log went to the file, not the terminal


def test_a_failed_generate_is_one_line(monkeypatch, tmp_path, vllm_logger):
    backend = _fake_backend(monkeypatch, tmp_path)
    with pytest.raises(BebopError, match=r"^vLLM could not generate: vLLM's CPU attention does not support this "
                                         r"model's head size 16") as caught:
        backend.rollout([[1, 2]], SamplingParams(max_new_tokens=4), SpecConfig("none"))
    assert isinstance(caught.value, RuntimeError)  # check-lossless counts a crashed setting as a failed check


def test_a_defective_vllm_refuses_speculative_sampling_at_positive_temperature(monkeypatch, tmp_path, vllm_logger):
    backend = _fake_backend(monkeypatch, tmp_path, found=vllm_cpu_fix.DEFECTIVE)
    monkeypatch.delenv(vllm_cpu_fix.ENV_FLAG, raising=False)
    with pytest.raises(BebopError, match="expands per-request temperatures wrongly"):
        backend.rollout([[1, 2]], SamplingParams(temperature=1.0, max_new_tokens=4), SpecConfig("rs", 3))
    for sampling, spec in ((SamplingParams(temperature=0.0), SpecConfig("rs", 3)),
                           (SamplingParams(temperature=1.0), SpecConfig("none"))):
        with pytest.raises(BebopError, match="could not generate"):  # sampling goes ahead (and the fake fails)
            backend.rollout([[1, 2]], sampling, spec)


@pytest.mark.parametrize("arch, device, expected", [
    ("qwen3_5_hybrid", "cpu", {"dtype": "bfloat16", "enable_prefix_caching": False}),
    ("nemotron_h", "cpu", {"dtype": "bfloat16", "enable_prefix_caching": False}),
    ("qwen3_5_hybrid", "cuda", {"dtype": "float32"}),
    ("qwen3_5", "cpu", {"dtype": "float32"}),
])
def test_engine_options_serve_a_hybrid_on_a_cpu_in_bf16_without_prefix_caching(arch, device, expected):
    from tests.helpers.models import tiny_model

    assert vllm_backend.engine_options(tiny_model(arch).config, device, "float32") == expected


def test_a_hybrid_policy_starts_its_cpu_engine_in_bf16_without_prefix_caching(monkeypatch, tmp_path, vllm_logger,
                                                                             capsys):
    from tests.helpers.models import tiny_model

    backend = _fake_backend(monkeypatch, tmp_path)  # a fake vLLM in place; its Linear policy is replaced below
    hybrid = VllmBackend(tiny_model("qwen3_5_hybrid"), backend.tokenizer, workdir=tmp_path / "hybrid")
    assert "bfloat16" in capsys.readouterr().err  # the user is told the sampler's dtype differs from the policy's
    with pytest.raises(BebopError, match="could not generate"):  # the fake starts, then fails to generate
        hybrid.rollout([[1, 2]], SamplingParams(max_new_tokens=4), SpecConfig("none"))
    assert _FakeLLM.started_with["dtype"] == "bfloat16" and _FakeLLM.started_with["enable_prefix_caching"] is False


def test_vllm_completions_report_both_conventions_and_null_what_they_cannot_count():
    from bebop.speculative.completions import Completions
    from bebop.speculative.stats import SpecStats

    stats = SpecStats(speculate_k=2, num_drafts=4, num_draft_tokens=8, verifier_num_drafts=4,
                      verifier_num_accepted_tokens=6, verifier_accepted_per_pos=[4, 2])
    stats.num_accepted_tokens = vllm_backend.emitted_accepted([5, 4], stats.num_drafts)  # 3 + 4 - 4 = 3
    m = Completions([[1]] * 2, [[2] * 5, [2] * 4], ["", ""], [5, 4], ["length"] * 2, stats, False).spec_metrics()
    assert m["spec/accept_length"] == 1.75 and m["spec/verifier_accept_length"] == 2.5
    assert m["spec/verifier_accepted_per_pos"] == [1.0, 0.5] and m["spec/accepted_per_pos"] is None


class _BrokenVllmFinder:
    """Finds a ``vllm`` whose import fails on a missing dependency (as an incomplete install does)."""

    def find_spec(self, name, path=None, target=None):
        if name != "vllm":
            return None
        import importlib.util

        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        raise ModuleNotFoundError("No module named 'xformers'", name="xformers")


def test_a_vllm_whose_import_fails_on_a_dependency_is_named_in_one_line(monkeypatch):
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_BrokenVllmFinder(), *sys.meta_path])
    with pytest.raises(BebopError) as caught:
        vllm_backend.import_vllm()
    assert str(caught.value) == ("vLLM could not be imported: Python module xformers is missing from vLLM's "
                                 "environment: install it there (pip install xformers)")
