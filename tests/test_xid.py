"""XID classes from NVIDIA's catalog and docs/reference/causes-and-actions.md, "XID classes"."""

from __future__ import annotations

import pytest

from gpucert.xid import xid_rules


@pytest.mark.parametrize(
    ("xid", "severity", "cause", "ticket"),
    [
        (13, "note", "", "none"),  # application
        (31, "note", "", "none"),
        (43, "note", "", "none"),  # informational
        (48, "fail", "ecc", "remediation"),
        (63, "note", "", "none"),
        (64, "fail", "row_remap", "replacement"),
        (74, "fail", "nvlink", "remediation"),
        (79, "fail", "xid", "remediation"),
        (92, "warn", "ecc", "remediation"),  # only when repeated
        (94, "note", "", "none"),
        (95, "fail", "ecc", "remediation"),
        (119, "fail", "xid", "remediation"),
        (120, "fail", "xid", "remediation"),
        (157, "fail", "row_remap", "replacement"),
        (168, "warn", "config", "remediation"),
    ],
)
def test_each_class(xid: int, severity: str, cause: str, ticket: str) -> None:
    rule = xid_rules().loc[xid]
    assert (rule["severity"], rule["cause"], rule["ticket"]) == (severity, cause, ticket)


def test_every_catalog_code_has_a_rule_and_92_needs_repeats() -> None:
    rules = xid_rules()
    assert len(rules) == 172
    assert bool(rules.loc[92, "repeat_only"])
    assert not rules["repeat_only"].drop(92).any()
    # Codes NVIDIA marks unused on data-centre GPUs are unknown: they warn rather than pass silently.
    assert rules.loc[1, "klass"] == "unknown"
