"""Plain-text tables printed by the CLI."""

from __future__ import annotations


def acceptance_table(results: dict[str, dict]) -> str:
    """Markdown table of eval-mtp results: per-step RS/TO acceptance and accept lengths.

    Example row: ``| e2e_tv | 0.912 0.871 0.830 | 0.901 0.850 0.805 | 3.41 | 3.36 | 0.45 |``.
    """
    lines = [
        "| head | alpha_RS per step | alpha_TO per step | accept length RS | accept length TO | H(p) nats |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        rs = " ".join(f"{a:.3f}" for a in r["alpha_rs"])
        to = " ".join(f"{a:.3f}" for a in r["alpha_to"])
        lines.append(f"| {name} | {rs} | {to} | {r['accept_length_rs']:.3f} | {r['accept_length_to']:.3f} | "
                     f"{r['target_entropy']:.3f} |")
    return "\n".join(lines)
