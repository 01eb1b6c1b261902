"""The run's report: the HTML page stored with the run, and the artifacts a person reads in the UI."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx
from prefect import task
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from gpucert._frames import empty_results
from gpucert._text import counted
from gpucert.certify import CertificationRun, Settlement, TicketStep
from gpucert.network import PairingPlan
from gpucert.report import decision_table, done_view, render_html, summary_markdown, verdict_rows

__all__ = ["publish_report"]


def _artifact_key(what: str) -> str:
    # One key per kind (lowercase, digits, dashes: docs/design/testing.md), so the UI shows each kind's history.
    return f"certify-{what}"


def _prefect_unreachable(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: retry when the Prefect API did not answer. An artifact call makes a
    fresh client, which (unlike the flow's own) does not retry a refused connection: a server restart
    would otherwise fail the run after it acted, before its tickets."""
    try:
        state.result(raise_on_failure=True)
    except httpx.TransportError:
        return True
    except Exception:
        return False
    return False


@task(
    name="publish the report",
    cache_policy=NO_CACHE,
    retries=3,
    retry_delay_seconds=[5, 10, 20],
    retry_condition_fn=_prefect_unreachable,
)
def publish_report(
    run: CertificationRun,
    settlement: Settlement,
    actions: Mapping[str, str],
    links: PairingPlan | None = None,
    tickets: TicketStep | None = None,
) -> tuple[str, str]:
    """Render and store the run's ``report.html`` from its settled verdicts; publish the verdict table, the
    decisions, the markdown summary and a link to the report. ``links``, the plan the run measured its node
    pairs by (``gpucert.certify.stored_plan_of(run, policy)``; None when it measured none), adds the page's
    "Links" section; the page opens with what the run did: the decisions, ``actions`` (node → what was
    written to it: labels, taints, the condition) and the ``tickets`` step's events. Returns the report's
    URI and a link to it a browser opens (a presigned URL for S3, the store's public URL when it has one)."""
    verdicts = run.verdicts()
    results = run.results_or_none()
    baseline = run.store.read() if run.store.current_version() is not None else None
    done = done_view(
        settlement.frame(),
        actions=actions,
        tickets=tickets.events if tickets is not None else (),
        tickets_recorded=tickets.recorded if tickets is not None else 0,
        incident=settlement.incident or "",
    )
    html = render_html(
        results if results is not None else empty_results(),
        verdicts,
        run_id=run.run_id,
        baseline=baseline,
        links=links,
        done=done,
    )
    uri = run.write_report(html)
    link = run.store.link(run.key("report.html"))
    markdown = summary_markdown(verdicts, run_id=run.run_id, report_link=link, actions_taken=actions)
    if settlement.incident:
        markdown = f"> **Incident**: {settlement.incident}\n\n{markdown}"
    create_markdown_artifact(key=_artifact_key("summary"), markdown=markdown, description=f"certify {run.run_id}")
    create_table_artifact(
        key=_artifact_key("verdicts"), table=verdict_rows(verdicts), description=f"verdicts of {run.run_id}"
    )
    decisions, left_out = decision_table(settlement.frame())
    quiet = (
        f"; {counted(left_out, 'node')} certified untainted not listed (decisions.parquet has all)" if left_out else ""
    )
    create_table_artifact(
        key=_artifact_key("decisions"),
        table=decisions,
        description=f"the settled decision per node of {run.run_id}{quiet}",
    )
    create_link_artifact(key=_artifact_key("report"), link=link, link_text=f"report of {run.run_id}")
    return uri, link
