"""Tests for bebop.analysis.roles: a run's role from its config, and which role the report's answer is about."""

from bebop.analysis.roles import answer_role, role_name, speculative_roles
from bebop.analysis.runs import Run


def _run(label, mode, loss=None, **extra):
    config = {"label": label, "mode": mode, "mtp_loss": loss, "mtp_update": "frozen", **extra}
    return Run(label, config, [{"step": 0}], None)


def test_role_name_drops_the_runs_own_label_and_marks_trl_runs():
    assert role_name(_run("rs+e2e_tv-seed1", "rs", "e2e_tv")) == "rs+e2e_tv"
    assert role_name(_run("mine", "to", "ce", mtp_update="online", online_loss="ce")) == "to+ce+online-ce"
    assert role_name(_run("trl:rs+e2e_tv", "rs", "e2e_tv", trainer="trl")) == "trl:rs+e2e_tv"
    assert role_name(_run("base", "none")) == "none"


def test_speculative_roles_group_seeds_in_the_order_given():
    runs = [_run("none", "none"), _run("a", "to", "ce"), _run("b", "rs", "e2e_tv"), _run("c", "to", "ce")]
    roles = speculative_roles(runs)
    assert list(roles) == ["to+ce", "rs+e2e_tv"] and [r.label for r in roles["to+ce"]] == ["a", "c"]


def test_answer_role_prefers_the_papers_recipe_else_the_first_speculative_role():
    to, rs_ce, recipe = _run("a", "to", "ce"), _run("b", "rs", "ce"), _run("c", "rs", "e2e_tv")
    online = _run("d", "rs", "e2e_tv", mtp_update="online", online_loss="ce")
    assert answer_role([to, rs_ce, online, recipe]) == ("rs+e2e_tv", [recipe])
    assert answer_role([online, rs_ce]) == ("rs+e2e_tv+online-ce", [online])
    assert answer_role([_run("none", "none")]) is None
