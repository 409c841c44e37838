"""Analysis of RL runs and MTP heads: acceptance-vs-entropy fits, the RS-vs-TO rule, plots, reports.

- ``fit``: least-squares fits with t intervals, entropy buckets, the Eq. 16 entropy/mismatch
  split, the RS-vs-TO decision rule (Eq. 48) and the expected accept length (Eq. 12).
- ``plots``: one PNG per figure of the paper that the runs can reproduce.
- ``report``: loads run directories and writes ``report.md`` with tables and plots.
"""

from bebop.analysis.fit import (
    BucketedFit,
    LinearFit,
    bucketed_fit,
    entropy_mismatch_split,
    expected_accept_length,
    linear_fit,
    rs_vs_to,
    student_t_quantile,
)
from bebop.analysis.report import Run, load_run, summarize_run, write_report

__all__ = [
    "BucketedFit",
    "LinearFit",
    "Run",
    "bucketed_fit",
    "entropy_mismatch_split",
    "expected_accept_length",
    "linear_fit",
    "load_run",
    "rs_vs_to",
    "student_t_quantile",
    "summarize_run",
    "write_report",
]
