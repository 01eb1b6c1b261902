"""certify's link step: the nodes measured in pairs, round by round, then re-paired where nothing explains a
low pair yet (``gpucert.network``). Each round is one task run, so the rounds and re-pairings show in the
run; the pair rows join the run's ``results.parquet`` and the plan is stored with the run, which the
judge step then reads (:func:`gpucert.certify.verdicts_with_links`)."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from gpucert._text import counted
from gpucert.certify import (
    RESULTS,
    BenchmarkSettings,
    CertificationRun,
    link_findings,
    link_plan,
    link_seed,
    run_pair_round,
    store_plan,
)
from gpucert.kube import Kube
from gpucert.network import PairingPlan, repairs
from gpucert.policy import Policy
from gpucert.results import join_parquet
from gpucert.store import empty_baseline

from ._slots import benchmark_slot

__all__ = ["LinkOutcome", "measure_links"]


@dataclass(frozen=True)
class LinkOutcome:
    """What the link step did: rounds and re-pairing rounds run, pairs measured and failed, what it named."""

    def lines(self) -> list[str]:
        """The step in a few lines (the run's outcome carries them); empty when no pair was planned."""
        if not self.pairs:
            return []
        head = f"{self.pairs} pairs in {self.rounds} rounds and {self.repair_rounds} re-pairing rounds" + (
            f", {len(self.failed)} pair Jobs failed" if self.failed else ""
        )
        return [head, *self.summary]

    rounds: int = 0
    repair_rounds: int = 0
    pairs: int = 0
    failed: dict[str, str] = field(default_factory=dict)
    culprits: tuple[str, ...] = ()
    uplinks: tuple[str, ...] = ()
    summary: tuple[str, ...] = ()


@task(name="pair round", task_run_name="{stage} round {index} of {run.run_id}", cache_policy=NO_CACHE)
async def pair_round(
    kube: Kube,
    run: CertificationRun,
    pairs: Sequence[tuple[str, str]],
    payload: Mapping[str, Any],
    settings: BenchmarkSettings,
    *,
    gpus: Mapping[str, int],
    max_parallel: int,
    index: int,
    stage: str,
) -> tuple[bytes | None, dict[str, str]]:
    """One round of pair Jobs; returns its rows as Parquet (None when no pair produced any: data crosses
    tasks as bytes, not frames) and ``a – b`` → why, for each pair that failed."""
    # A pair Job holds a slot of the benchmarks' global concurrency limit, as a node's Job does.
    done = await run_pair_round(
        kube, pairs, run.run_id, payload, settings, gpus=gpus, max_parallel=max_parallel, slot=await benchmark_slot()
    )
    failed = {f"{a} – {b}": f"{r.reason}: {r.message}" for (a, b), r in done.failed().items()}
    get_run_logger().info(
        "%s round %d: %s measured, %d failed", stage, index, counted(len(pairs) - len(failed), "pair"), len(failed)
    )
    if done.results is None or done.results.empty:
        return None, failed
    buffer = io.BytesIO()
    done.results.to_parquet(buffer, index=False)
    return buffer.getvalue(), failed


async def measure_links(
    kube: Kube,
    run: CertificationRun,
    selector: str,
    gpus: Mapping[str, int],
    payload: Mapping[str, Any],
    settings: BenchmarkSettings,
    policy: Policy,
    *,
    max_parallel: int,
) -> LinkOutcome:
    """Measure the links of ``gpus``' nodes (those whose own benchmark ran) when the policy asks for pairs:
    the plan's rounds, then up to ``network.repair_rounds`` re-pairings while the judgement wants one. The
    plan is stored with the run and the pair rows appended to its ``results.parquet``."""
    if not policy.network.pairs or len(gpus) < 2:
        return LinkOutcome()
    log = get_run_logger()
    plan = link_plan(kube.nodes(selector), list(gpus), policy=policy, run_id=run.run_id)
    planned = plan.rounds
    for note in plan.notes:
        log.info("pairing: %s", note)
    parts: list[bytes] = []
    frames: list[pd.DataFrame] = []  # the same rows, read once: every judgement of the step takes them all
    failed: dict[str, str] = {}

    async def measure(rounds: PairingPlan, first: int, stage: str) -> None:
        for index in range(first, rounds.rounds):
            table = rounds.round(index)
            pairs = list(zip(table["node"].astype(str), table["peer"].astype(str), strict=True))
            data, lost = await pair_round(
                kube, run, pairs, payload, settings, gpus=gpus, max_parallel=max_parallel, index=index, stage=stage
            )
            failed.update(lost)
            if data is not None:
                parts.append(data)
                frames.append(pd.read_parquet(io.BytesIO(data)))

    await measure(plan, 0, "pair")
    baseline = run.store.read() if run.store.current_version() is not None else empty_baseline()
    judgement = link_findings(pd.concat(frames, ignore_index=True), plan, baseline, policy) if parts else None
    repaired = 0
    while judgement is not None and judgement.pending and repaired < policy.network.repair_rounds:
        more = repairs(judgement, plan, seed=link_seed(run.run_id) + repaired + 1)
        if more.pairs.empty:
            break
        first = plan.rounds
        plan = plan.extended(more)
        await measure(plan, first, "re-pair")
        judgement = link_findings(pd.concat(frames, ignore_index=True), plan, baseline, policy)
        repaired += 1
    store_plan(run, plan)
    _append_results(run, parts)
    summary = tuple(judgement.summary()) if judgement is not None else ("no pair produced a result",)
    for line in summary:
        log.info("links: %s", line)
    return LinkOutcome(
        rounds=planned,
        repair_rounds=repaired,
        pairs=len(plan.pairs),
        failed=failed,
        culprits=judgement.culprits if judgement is not None else (),
        uplinks=tuple(f"{a} ↔ {b}" for a, b in judgement.uplinks) if judgement is not None else (),
        summary=summary,
    )


def _append_results(run: CertificationRun, parts: Sequence[bytes]) -> None:
    """The pair rows after the run's own rows in its ``results.parquet``, streamed (one part at a time)."""
    if not parts:
        return
    head = [run.store.read_run_file(run.folder, run.day, run.file(RESULTS))] if run.has(RESULTS) else []
    joined = join_parquet([*head, *parts])
    if joined is not None:
        run.write_file(RESULTS, joined)
