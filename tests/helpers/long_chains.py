"""One 16,384-token sequence through train-mtp's step, eval-mtp or the online head step, in a fresh process:
``python -m tests.helpers.long_chains KIND`` prints {"extra_mb": peak RSS beyond the start, "value": a result}."""

from __future__ import annotations

import json
import sys

import torch

from bebop.mtp.data import Sequences
from bebop.mtp.head import MtpHead

LENGTH = 16_384
K = 3


def _status_mb(key: str) -> float:
    """VmRSS / VmHWM of this process in MB (Linux)."""
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024
    raise KeyError(key)


def run(kind: str) -> dict:
    from tests.helpers.models import tiny_model

    torch.set_num_threads(1)
    model = tiny_model("qwen3", max_position_embeddings=LENGTH)
    head = MtpHead(model)
    ids = torch.randint(1, 64, (LENGTH,), generator=torch.Generator().manual_seed(0)).tolist()
    data = Sequences([ids], [1])
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # NOTE: VmHWM := VmRSS, so the peak below is the work's
    base = _status_mb("VmRSS")
    if kind == "train-mtp":
        from bebop.mtp.loss import chain_loss

        loss, _, _ = chain_loss(model, head, *data.batch([0], 0, torch.device("cpu")), K, "served", "e2e_tv", 1.0)
        loss.backward()
        value = float(loss)
    elif kind == "eval-mtp":
        from bebop.mtp.evaluate import evaluate_mtp

        value = evaluate_mtp(model, head, data, speculate_k=K)["accept_length_rs"]
    else:
        from bebop.rl.config import MtpUpdateConfig
        from bebop.rl.online import make_head_optimizer, online_head_step

        cfg = MtpUpdateConfig(mtp_update="online", mtp_speculate_k=K)
        value = online_head_step(model, head, make_head_optimizer(head, cfg), data, cfg, 1.0, 0)["mtp/loss"]
    return {"extra_mb": _status_mb("VmHWM") - base, "value": value}


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1])))
