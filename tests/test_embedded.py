"""The embedded default: a Qwen3.5 text model that vLLM's CPU build serves, pretrained reproducibly."""

from __future__ import annotations

import random

import pytest
import torch

from bebop import embedded, models
from bebop.task import arith
from bebop.utils.errors import BebopError
from bebop.utils.torch_utils import state_sha256


def _pretrained_hash(tmp_path, threads: int) -> str:
    torch.set_num_threads(threads)
    embedded.pretrain(tmp_path / f"model-{threads}", embedded.PretrainConfig(steps=2, batch_size=8, eval_problems=1),
                      show_progress=False)
    model, _ = models.load_model(tmp_path / f"model-{threads}")
    return state_sha256(model)


def test_pretraining_gives_the_same_weights_at_any_thread_count(tmp_path):
    """Float sums may reduce in a thread-count-dependent order; pretraining pins its own thread count
    (PRETRAIN_THREADS), so `--threads` or a machine with other cores cannot change the embedded model.
    NOTE: on this machine one and two threads already agree for this model (gradients bit-identical at
    batch 32), so this test guards the claim; it did not reproduce a failure."""
    assert _pretrained_hash(tmp_path, 1) == _pretrained_hash(tmp_path, 2)
    assert torch.get_num_threads() == 2  # the caller's setting is restored


def test_embedded_model_is_a_vllm_servable_qwen3_5():
    tok = embedded.build_tokenizer()
    model = embedded.build_model(embedded.PretrainConfig(), len(tok), tok.pad_token_id, tok.eos_token_id)
    cfg = model.config
    assert type(model).__name__ == "Qwen3_5ForCausalLM" and cfg.model_type == "qwen3_5_text"
    assert set(cfg.layer_types) == {"full_attention"}  # no linear attention: fp32 on vLLM's CPU build
    assert cfg.head_dim >= 32  # vLLM's CPU attention refuses smaller heads
    assert embedded.EMBEDDED_VERSION != "v1"  # caches of the old Qwen3 default are not reused


def test_pretraining_mixes_careless_answers_at_the_configured_share():
    tok = embedded.build_tokenizer()
    texts = []
    for share in (0.0, 0.5):
        ids, mask = embedded._training_batch(random.Random(0), tok, 400, share)
        texts.append([tok.decode(row[m].tolist()) for row, m in zip(ids, mask)])
    assert not any(arith.is_guess(t) for t in texts[0])
    assert 0.4 < sum(arith.is_guess(t) for t in texts[1]) / 400 < 0.6  # 0.5 +- 5 sigma (sigma = 0.025)


def test_guess_share_must_leave_careful_answers():
    with pytest.raises(BebopError, match="guess_share"):
        embedded.check_pretrain_config(embedded.PretrainConfig(guess_share=1.0))


def test_full_attention_interval_4_builds_qwen3_5s_three_to_one_hybrid():
    tok = embedded.build_tokenizer()
    model = embedded.build_model(embedded.PretrainConfig(full_attention_interval=4), len(tok), tok.pad_token_id,
                                 tok.eos_token_id)
    cfg = model.config
    assert cfg.layer_types == ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"]
    assert cfg.linear_key_head_dim == cfg.linear_value_head_dim == 64  # vLLM's CPU Gated DeltaNet kernels: 64 or 128
    assert cfg.linear_num_key_heads * cfg.linear_key_head_dim == cfg.hidden_size


@pytest.mark.parametrize("fields, match", [({"full_attention_interval": 0}, "full_attention_interval"),
                                           ({"full_attention_interval": 9}, "full_attention_interval"),
                                           ({"linear_head_dim": 48}, "linear_head_dim")])
def test_hybrid_shapes_that_cannot_be_built_are_refused(fields, match):
    with pytest.raises(BebopError, match=match):
        embedded.check_pretrain_config(embedded.PretrainConfig(**fields))
