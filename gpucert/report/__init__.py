"""The certify run's reports, built from the results and verdict tables (docs/design/data-contracts.md),
and operate's drift view of each drifting GPU's own history: pure functions (no Prefect here; the certify
flow turns them into artifacts).

:func:`verdict_rows` and :func:`decision_table` make table artifacts, :func:`summary_markdown` the markdown
one; :func:`render_html` the self-contained page stored with the run (``runs/…/report.html``, opened
offline), with :func:`done_view` ("What was done"), :func:`drift_view` and :func:`link_view` ("Links") as
its sections; :func:`render_drift_html` a drift page of its own.
"""

from __future__ import annotations

from ._charts import VERDICT_COLOURS
from ._done import done_view
from ._drift import drift_view, render_drift_html
from ._html import render_html
from ._links import link_view
from ._rows import ROW_KEYS, decision_table, is_summary_row, verdict_rows
from ._summary import md_escape, summary_markdown

__all__ = [
    "ROW_KEYS",
    "VERDICT_COLOURS",
    "decision_table",
    "done_view",
    "drift_view",
    "is_summary_row",
    "link_view",
    "md_escape",
    "render_drift_html",
    "render_html",
    "summary_markdown",
    "verdict_rows",
]
