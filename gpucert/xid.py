"""XID codes sorted into what they mean for a certification: ignore, warn, or fail with a cause.

Each code of the NVIDIA Xid catalog (``data/xid_catalog.csv``) by its *immediate action* bucket, and the few
codes more specific than their bucket (docs/reference/causes-and-actions.md, "XID classes", the table this
module generates). Application-class XIDs (13, 31, 94, …) are the workload's fault, never the GPU's verdict.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from io import StringIO

import pandas as pd

__all__ = ["XID_RULE_COLUMNS", "xid_rules"]

XID_RULE_COLUMNS = ("klass", "severity", "repeat_only", "cause", "action", "ticket", "mnemonic")

# (class, severity, fires only when repeated, cause, action, ticket) per catalog immediate action.
_BY_BUCKET: dict[str, tuple[str, str, bool, str, str, str]] = {
    "RESTART_APP": ("application", "note", False, "", "none", "none"),
    "IGNORE": ("informational", "note", False, "", "none", "none"),
    "XID_154": ("informational", "note", False, "", "none", "none"),
    "WORKFLOW_XID_45": ("informational", "note", False, "", "none", "none"),
    "RESET_GPU": ("reset", "fail", False, "xid", "reset_gpu", "remediation"),
    "RESTART_BM": ("reboot", "fail", False, "xid", "reboot_node", "remediation"),
    "RESTART_VM": ("reboot", "fail", False, "xid", "reboot_node", "remediation"),
    "WORKFLOW_XID_48": ("workflow", "fail", False, "ecc", "reset_gpu", "remediation"),
    "WORKFLOW_NVLINK_ERR": ("workflow", "fail", False, "nvlink", "reset_gpu", "remediation"),
    "CHECK_MECHANICALS": ("physical", "warn", False, "power", "check_power", "remediation"),
    "UPDATE_SWFW": ("physical", "warn", False, "config", "fix_config", "remediation"),
}

# Codes whose meaning is more specific than their bucket (docs/reference/causes-and-actions.md, "XID classes").
_OVERRIDES: dict[int, tuple[str, str, bool, str, str, str]] = {
    64: ("reset", "fail", False, "row_remap", "run_field_diag", "replacement"),
    95: ("reset", "fail", False, "ecc", "reset_gpu", "remediation"),
    140: ("reset", "fail", False, "ecc", "reset_gpu", "remediation"),
    92: ("monitor", "warn", True, "ecc", "run_field_diag", "remediation"),
    157: ("rma", "fail", False, "row_remap", "run_field_diag", "replacement"),
    167: ("reset", "fail", False, "pcie", "reset_gpu", "remediation"),
    169: ("reset", "fail", False, "xid", "reset_gpu", "remediation"),
    168: ("physical", "warn", False, "config", "fix_config", "remediation"),
    171: ("informational", "note", False, "", "none", "none"),
    172: ("informational", "note", False, "", "none", "none"),
}

#: The rule for a code the catalog does not know or that does not apply to data-centre GPUs.
UNKNOWN_RULE = ("unknown", "warn", False, "xid", "retest", "remediation", "")


@cache
def xid_rules() -> pd.DataFrame:
    """One row per catalog XID, indexed by code: what a certification does when a GPU logs it."""
    text = resources.files("gpucert").joinpath("data/xid_catalog.csv").read_text(encoding="utf-8")
    catalog = pd.read_csv(StringIO(text), usecols=["xid", "mnemonic", "h100", "immediate_action"])
    rows = []
    for code, mnemonic, applies, bucket in catalog.itertuples(index=False):  # 172 catalog rows, once
        rule = _OVERRIDES.get(int(code))
        if rule is None and applies == "YES" and isinstance(bucket, str):
            rule = _BY_BUCKET.get(bucket)
        if rule is None:
            rule = UNKNOWN_RULE[:6]
        rows.append((int(code), *rule, str(mnemonic)))
    table = pd.DataFrame(rows, columns=["xid", *XID_RULE_COLUMNS]).set_index("xid")
    return table
