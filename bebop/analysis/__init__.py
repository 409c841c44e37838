"""Analysis of RL runs and MTP heads: acceptance-vs-entropy fits, the RS-vs-TO rule, plots, reports.

- ``fit``: least-squares fits with t intervals, entropy buckets, the Eq. 16 entropy/mismatch
  split, the RS-vs-TO decision rule (Eq. 48) and the expected accept length (Eq. 12).
- ``bootstrap``: intervals that fit the data (block bootstrap over RL steps, bootstrap over
  sequences) and the reproduced / not reproduced / inconclusive verdict.
- ``slopes``: accept length against entropy from RL steps, a temperature sweep or token level.
- ``runs`` / ``roles``: loading run directories; which run plays which part.
- ``findings``: the paper's findings with verdicts computed from data.
- ``answer``: the report's first section: step time with and without MTP, accept length against entropy.
- ``plots``: one PNG per figure the runs can reproduce.
- ``report``: writes ``report.md``, answer first, then the findings the runs answer, tables and plots.
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
from bebop.analysis.bootstrap import Interval, decide
from bebop.analysis.report import write_report
from bebop.analysis.runs import Run, load_run
from bebop.analysis.summary import summarize_run

__all__ = [
    "BucketedFit",
    "Interval",
    "LinearFit",
    "Run",
    "bucketed_fit",
    "decide",
    "entropy_mismatch_split",
    "expected_accept_length",
    "linear_fit",
    "load_run",
    "rs_vs_to",
    "student_t_quantile",
    "summarize_run",
    "write_report",
]
