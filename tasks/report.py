"""The run's report: the HTML page stored with the run, and the artifacts a person reads in the UI."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

import pandas as pd
from prefect import task
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from gpucert.certify import read_run_results, read_run_verdicts
from gpucert.errors import StoreError
from gpucert.report import render_html, summary_markdown, verdict_rows
from gpucert.store import BaselineStore

__all__ = ["publish_report"]


def _artifact_key(what: str) -> str:
    # One key per kind (lowercase, digits, dashes: REFERENCE §9), so the UI shows each kind's history.
    return f"certify-{what}"


@task(name="publish the report", cache_policy=NO_CACHE)
def publish_report(
    store: BaselineStore,
    run_id: str,
    day: datetime,
    *,
    actions: Mapping[str, str],
    incident: str | None,
) -> str:
    """Render and store ``report.html`` for the run, publish the verdict table, the markdown summary and a
    link to the report; returns the report's URI."""
    verdicts = read_run_verdicts(store, run_id, day.date())
    try:
        results = read_run_results(store, run_id, day.date())
    except StoreError:  # no node produced results (no results.parquet): the report still shows why
        results = None
    current = store.current_version()
    baseline = store.read(current) if current is not None else None
    html = render_html(
        results if results is not None else _empty_results(), verdicts, run_id=run_id, baseline=baseline
    )
    key = store.write_run_file(run_id, day.date(), "report.html", html.encode("utf-8"))
    uri = f"{store.uri.rstrip('/')}/{key}"
    markdown = summary_markdown(verdicts, run_id=run_id, report_link=uri, actions_taken=actions)
    if incident:
        markdown = f"> **Incident**: {incident}\n\n{markdown}"
    create_markdown_artifact(key=_artifact_key("summary"), markdown=markdown, description=f"certify {run_id}")
    create_table_artifact(
        key=_artifact_key("verdicts"), table=verdict_rows(verdicts), description=f"verdicts of {run_id}"
    )
    create_link_artifact(key=_artifact_key("report"), link=uri, link_text=f"report of {run_id}")
    return uri


def _empty_results() -> pd.DataFrame:
    from gpucert._frames import empty_results

    return empty_results()
