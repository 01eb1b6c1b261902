"""The HTML report: one self-contained page (inline CSS and SVG, no script, nothing fetched)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from .._templates import html_environment
from ..network import PAIR_METRIC, PairingPlan
from ._charts import REFERENCE_TEXT, VERDICT_COLOURS, HeatMap, StripChart, heat_map, relative_frame, strip_charts
from ._common import KIND_WORDS, NON_PASS, entity_kinds, for_run, require_columns
from ._done import DoneView
from ._drift import DriftView
from ._links import LinkView, link_view
from ._rows import is_summary_row, verdict_rows

__all__ = ["TEMPLATE", "render_html"]

TEMPLATE = "report.html.j2"
_RESULT_COLUMNS = ("node", "gpu", "metric", "value")
_VERDICT_COLUMNS = ("verdict", "node", "gpu", "reference_kind")


@dataclass(frozen=True)
class _Count:
    verdict: str
    count: int
    colour: str


def _counts(verdicts: pd.DataFrame, kinds: Any) -> tuple[list[_Count], list[tuple[str, int, list[_Count]]]]:
    entity = verdicts[kinds != "fleet"]
    values = entity["verdict"].astype(object)
    order = [*NON_PASS, "pass"]
    totals = [_Count(v, int((values == v).sum()), VERDICT_COLOURS.get(v, "#777")) for v in order]
    per_kind = []
    for kind, word in KIND_WORDS:
        part = verdicts["verdict"].astype(object)[kinds == kind]
        if len(part):
            per_kind.append((word, len(part), [_Count(v, int((part == v).sum()), VERDICT_COLOURS[v]) for v in order]))
    return totals, per_kind


def render_html(
    results: pd.DataFrame,
    verdicts: pd.DataFrame,
    *,
    run_id: str,
    baseline: pd.DataFrame | None = None,
    title: str | None = None,
    max_heatmap_nodes: int = 120,
    max_table_rows: int = 500,
    drift: DriftView | None = None,
    links: PairingPlan | None = None,
    max_link_nodes: int = 120,
    done: DoneView | None = None,
) -> str:
    """The run's HTML report as one self-contained page (``templates/report.html.j2``; every value from the
    data escaped by its autoescape).

    ``results`` and ``verdicts`` are one run's tables (docs/design/data-contracts.md; rows of other runs are
    ignored); ``baseline`` supplies each GPU's own reference where its verdict has none. The page: counts per
    verdict, fleet findings, a node × GPU heat map (the nodes that did not pass up to ``max_heatmap_nodes``,
    then a sample of passing ones), a strip chart per metric, and the verdicts other than pass (at most
    ``max_table_rows``). ``drift`` (:func:`drift_view`), ``links`` (the plan the run measured its pairs by:
    :func:`link_view`, up to ``max_link_nodes``) and ``done`` (:func:`done_view`, at the top) add their
    sections. Raises ``ValueError`` for a table without a column it reads, ``jinja2.TemplateError`` for a
    broken template.
    """
    require_columns(results, _RESULT_COLUMNS, "results")
    require_columns(verdicts, _VERDICT_COLUMNS, "verdicts")
    results = for_run(results, run_id)
    verdicts = for_run(verdicts, run_id)
    kinds = entity_kinds(verdicts)

    rel = relative_frame(results, verdicts, baseline)
    charts: list[StripChart] = strip_charts(rel, verdicts)
    heat: HeatMap = heat_map(rel, verdicts, max_nodes=max_heatmap_nodes)
    rows = verdict_rows(verdicts, limit=max_table_rows)
    listed = [r for r in rows if not is_summary_row(r)]
    notes = [r["reasons"] for r in rows if is_summary_row(r)]
    fleet = [r for r in listed if r["node"] is None]
    table = [r for r in listed if r["node"] is not None]
    totals, per_kind = _counts(verdicts, kinds)
    pairs: LinkView | None = (
        link_view(results, verdicts, links, max_nodes=max_link_nodes) if links is not None else None
    )

    models = sorted({str(m) for m in rel["gpu_model"].dropna().unique()})
    measured = None
    if "ts" in results.columns and len(results):
        ts = pd.to_datetime(results["ts"], utc=True, errors="coerce").max()
        measured = None if pd.isna(ts) else ts.strftime("%Y-%m-%d %H:%M UTC")

    template = html_environment().get_template(TEMPLATE)
    return template.render(
        title=title or f"gpucert certification report — {run_id}",
        run_id=run_id,
        measured=measured,
        models=models,
        totals=totals,
        per_kind=per_kind,
        fleet=fleet,
        fleet_shift=[r for r in fleet if r["metric"] != PAIR_METRIC],
        fleet_network=[r for r in fleet if r["metric"] == PAIR_METRIC],
        heat=heat,
        charts=charts,
        table=table,
        table_notes=notes,
        colours=VERDICT_COLOURS,
        reference_text=REFERENCE_TEXT,
        with_baseline=baseline is not None and len(baseline) > 0,
        drift=drift if drift is not None and not drift.empty else None,
        links=pairs,
        done=done,
    )
