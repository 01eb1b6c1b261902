"""The run's markdown summary: what failed, why, and what to do about it.

Values come from the cluster (node names) and from the engine (reasons), so every one goes through
:func:`md_escape` before it lands in markdown: a ``|`` would split a table cell, a newline would end a
row, and ``<``, ``[`` or a backtick would start HTML, a link or code.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import pandas as pd

from .._text import counted
from ._common import (
    KIND_WORDS,
    NON_PASS,
    entity_kinds,
    for_run,
    format_gpus,
    ordered_non_pass,
    records,
    require_columns,
    text_or_none,
)

__all__ = ["md_escape", "summary_markdown"]

_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|#!])")
_NEWLINES = re.compile(r"\s*[\r\n\u2028\u2029]+\s*")
_REASONS_CHARS = 600
_WHERE_NODES = 30


def md_escape(value: Any) -> str:
    """``value`` as markdown text that renders as itself, safe inside a table cell: newlines a space (a row
    is one line), the ends trimmed, markdown's punctuation backslash-escaped (``|``, ``<script>``, ``[x](y)``)."""
    text = "" if value is None else str(value)
    return _MD_SPECIAL.sub(r"\\\1", _NEWLINES.sub(" ", text).strip())


def _cap(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _float(value: Any) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _num(value: Any) -> str | None:
    x = _float(value)
    return None if x is None else f"{x:.4g}"


def _check(row: Mapping[str, Any]) -> str:
    """The deciding comparison in words: ``h2d_gbps 26.2, -49.6 % vs own 51.9``, ``pcie_gen 4 against gate 5``."""
    metric = text_or_none(row.get("metric"))
    if metric is None:
        return ""
    kind = text_or_none(row.get("reference_kind")) or "reference"
    value, reference = _num(row.get("value")), _num(row.get("reference"))
    dev = _float(row.get("deviation_pct"))
    if kind == "fleet":  # value and reference are factors (0.97 against 1): the percentage says it
        return f"{metric} {dev:+.1f} %" if dev is not None else metric
    text = metric if value is None else f"{metric} {value}"
    if dev is not None:
        text += f", {dev:+.1f} % vs {kind}" + (f" {reference}" if reference is not None else "")
    elif reference is not None:
        text += f" against {kind} {reference}"
    return text


def _counts(verdicts: pd.DataFrame) -> str:
    counts = verdicts["verdict"].astype(object).value_counts()
    order = [*NON_PASS, "pass"] + [v for v in counts.index if v not in (*NON_PASS, "pass")]
    return " · ".join(f"{md_escape(v)} {int(counts.get(v, 0)):,}" for v in order)


def _per_kind(verdicts: pd.DataFrame, kinds: Any) -> list[str]:
    lines = []
    verdict = verdicts["verdict"].astype(object).to_numpy()
    for kind, word in KIND_WORDS:
        counts = pd.Series(verdict[kinds == kind], dtype=object).value_counts()
        if counts.empty:
            continue
        bad = ", ".join(f"{int(counts[v]):,} {v}" for v in NON_PASS if counts.get(v, 0))
        lines.append(f"- {word}: {int(counts.sum()):,} judged" + (f", {bad}" if bad else ", all pass"))
    return lines


def _where(rows: list[dict[str, Any]]) -> str:
    """Which nodes, GPUs and pairs ``rows`` name: ``n1 (GPUs 0–7, node); n2 (GPU 3)``."""
    per_node: dict[str, dict[str, list[Any]]] = {}
    for row in rows:
        bits = per_node.setdefault(row["_node"], {"gpu": [], "node": [], "pair": []})
        if row["_kind"] in bits:
            bits[row["_kind"]].append(row["_gpu"] if row["_kind"] == "gpu" else row["_peer"])
    parts = []
    for node, bits in list(per_node.items())[:_WHERE_NODES]:
        words = []
        if bits["gpu"]:
            words.append(("GPU " if len(bits["gpu"]) == 1 else "GPUs ") + format_gpus(bits["gpu"]))
        if bits["node"]:
            words.append("node")
        if bits["pair"]:
            words.append("pair with " + ", ".join(md_escape(p) for p in bits["pair"]))
        parts.append(f"{md_escape(node)} ({', '.join(words)})" if words else md_escape(node))
    if len(per_node) > _WHERE_NODES:
        parts.append(f"… and {len(per_node) - _WHERE_NODES:,} more nodes")
    return "; ".join(parts)


def _link(url: str) -> str:
    # Percent-encode what would end the link target early (spaces, parentheses, angle brackets).
    return quote(url, safe=":/?#@!$&'*+,;=%~[]")


def summary_markdown(
    verdicts: pd.DataFrame,
    *,
    run_id: str,
    report_link: str | None = None,
    actions_taken: Mapping[str, str] | None = None,
    max_rows: int = 100,
) -> str:
    """A markdown summary of one run's ``verdicts`` for a Prefect markdown artifact: counts, a link to the
    HTML report, the fleet findings, per verdict what did not pass and why (at most ``max_rows`` rows each),
    what to do grouped by action, and the node-level ``actions_taken`` (node → what was done). Every value
    is escaped with :func:`md_escape`. Raises ``ValueError`` when the table lacks a contract column it reads.
    """
    require_columns(
        verdicts, ("verdict", "node", "gpu", "reference_kind", "cause", "action", "ticket", "reasons"), "verdicts"
    )
    verdicts = for_run(verdicts, run_id)
    kinds = entity_kinds(verdicts)
    ordered = ordered_non_pass(verdicts)
    fleet = ordered[ordered["_kind"] == "fleet"]
    entity = ordered[ordered["_kind"] != "fleet"]
    judged = int((kinds != "fleet").sum())

    out = [f"# gpucert run {md_escape(run_id)}", ""]
    if not len(verdicts):
        out.append("No verdicts were written for this run.")
    elif entity.empty:
        out.append(
            f"**{'The' if judged == 1 else 'All'} {counted(judged, 'check')} passed.** "
            f"{_counts(verdicts[kinds != 'fleet'])}"
        )
    else:
        out.append(
            f"**{len(entity):,} of {counted(judged, 'check')} did not pass:** {_counts(verdicts[kinds != 'fleet'])}"
        )
    if len(fleet):
        out[-1] += f"; and {len(fleet):,} fleet-level finding{'s' if len(fleet) != 1 else ''}."
    out.append("")
    out.extend(_per_kind(verdicts, kinds))
    if report_link:
        out += ["", f"[Open the full HTML report]({_link(report_link)}): charts per metric and a node × GPU map."]

    if len(fleet):
        out += ["", "## Fleet-level findings", ""]
        out.append("These flag no GPU: they point at the stack, the benchmark or the baseline.")
        out.append("")
        for row in records(fleet):
            check = _check(row)
            action = text_or_none(row.get("action"))
            line = f"- **{md_escape(row['verdict'])}**"
            if check:
                line += f" {md_escape(check)}:"
            line += f" {md_escape(_cap(str(text_or_none(row.get('reasons')) or ''), _REASONS_CHARS))}"
            if action and action != "none":
                line += f" — action: {md_escape(action)}"
            out.append(line)

    if len(entity):
        out += ["", "## What did not pass, and why"]
        for verdict in [*NON_PASS, *sorted(set(entity["verdict"].astype(str)) - set(NON_PASS))]:
            rows = entity[entity["verdict"].astype(str) == verdict]
            if rows.empty:
                continue
            out += ["", f"### {md_escape(verdict)} — {len(rows):,}", ""]
            out.append("| node | GPU | cause | action | ticket | deciding check | reasons |")
            out.append("|---|---|---|---|---|---|---|")
            for row in records(rows.iloc[:max_rows]):
                kind = row["_kind"]
                where = (
                    str(row["_gpu"])
                    if kind == "gpu"
                    else f"pair with {text_or_none(row.get('peer')) or '?'}"
                    if kind == "pair"
                    else "node"
                )
                cells = [
                    row.get("node"),
                    where,
                    text_or_none(row.get("cause")) or "",
                    text_or_none(row.get("action")) or "",
                    text_or_none(row.get("ticket")) or "",
                    _check(row),
                    _cap(text_or_none(row.get("reasons")) or "", _REASONS_CHARS),
                ]
                out.append("| " + " | ".join(md_escape(c) for c in cells) + " |")
            if len(rows) > max_rows:
                out += ["", f"… and {len(rows) - max_rows:,} more {md_escape(verdict)} rows: see the report."]

        out += ["", "## What to do", "", "| action | ticket | where |", "|---|---|---|"]
        # Non-pass rows are few, so plain records group faster than a pandas group-by per action.
        todo: dict[str, list[dict[str, Any]]] = {}
        for row in records(entity[["action", "ticket", "_node", "_kind", "_gpu", "_peer"]]):
            action = text_or_none(row["action"])
            if action is not None and action != "none":  # in verdict order: failures' actions first
                todo.setdefault(action, []).append(row)
        asked: dict[str, set[str]] = {"replacement": set(), "remediation": set()}
        for action, group in todo.items():
            tickets = {str(r["ticket"]) for r in group}
            for kind, nodes in asked.items():
                nodes.update(r["_node"] for r in group if r["ticket"] == kind)
            named = ", ".join(t for t in asked if t in tickets) or "none"
            out.append(f"| {md_escape(action)} | {md_escape(named)} | {_where(group)} |")
        asked_text = [
            f"{kind} on {len(nodes):,} node{'s' if len(nodes) != 1 else ''}" for kind, nodes in asked.items() if nodes
        ]
        if asked_text:
            out += ["", f"Tickets asked for: {', '.join(asked_text)}."]

    if actions_taken:
        out += ["", "## Actions taken on nodes", "", "| node | action |", "|---|---|"]
        for node in sorted(actions_taken):
            out.append(f"| {md_escape(node)} | {md_escape(actions_taken[node])} |")
    return "\n".join(out) + "\n"
