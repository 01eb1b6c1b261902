"""The certify run's reports, built from the results and verdict tables (docs/design/data-contracts.md),
and operate's drift view of each drifting GPU's own history.

The renderings, all pure functions (no Prefect here; the certify flow turns them into artifacts):

* :func:`verdict_rows` — JSON-able rows for a Prefect table artifact: what did not pass, worst first,
  and a count of what did;
* :func:`summary_markdown` — a markdown summary: what failed, why, what to do, fleet-level findings and
  the actions taken on nodes;
* :func:`render_html` — a self-contained HTML page (``templates/report.html.j2``) with inline SVG
  pictures: each GPU's performance relative to its reference per metric, stragglers marked, and a
  node × GPU heat map. It is stored with the run (``runs/…/report.html``) and opened offline;
* :func:`done_view` — the page's "What was done" section: the settled decisions, the taints and labels the
  run wrote, the tickets it opened, updated or resolved, and a blast-radius incident;
* :func:`drift_view` / :func:`render_drift_html` — each drifting GPU's own history (its baseline, every
  night's value, where the alarm rose and cleared) as a section of that page or a page of its own;
* :func:`link_view` — the page's "Links" section when the run measured node pairs: the pairing plan's
  facts, a partner × node matrix of each pair's bandwidth against its reference, and a table per leaf
  (``render_html(..., links=plan)`` draws it).
"""

from __future__ import annotations

from ._charts import VERDICT_COLOURS
from ._done import DoneView, done_view
from ._drift import DriftChart, DriftView, drift_view, render_drift_html
from ._html import render_html
from ._links import LinkView, link_view
from ._rows import DECISION_KEYS, ROW_KEYS, decision_table, is_summary_row, verdict_rows
from ._summary import md_escape, summary_markdown

__all__ = [
    "DECISION_KEYS",
    "ROW_KEYS",
    "VERDICT_COLOURS",
    "DoneView",
    "DriftChart",
    "DriftView",
    "LinkView",
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
