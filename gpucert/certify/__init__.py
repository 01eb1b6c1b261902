"""certify's core: benchmark Jobs on the cluster, their outcome, the results they logged, and what a run
concludes from them (docs/design/certify-runbook.md, "Where each step lives").

* :mod:`._jobs` — the benchmark units' objects: a node's Job, a pair's Indexed Job and headless Service, the
  payload ConfigMap; :mod:`._wave` runs either unit in one bounded async wave under the nodes' Leases;
* :mod:`._outcome` — what became of a Job (a failure outside the GPU is ``inconclusive``, never a GPU
  verdict); :mod:`._collect` — a succeeded pod's log → validated results rows;
* :mod:`._verdicts` — a run's verdicts, made in one place, and :func:`settle_offline`; :mod:`._links` — the
  run's pairing plan, stored with it;
* :mod:`._decide` — one run's verdicts → a :class:`NodeDecision` per node; :mod:`._settle` — the first run and
  its re-runs → one :class:`SettledDecision` per node; :mod:`._act` — decisions written to nodes;
* :mod:`._run` — a run's files in the store; :mod:`._shards` — a large run cut into shards; :mod:`._record` —
  inconclusive rows for failed Jobs, the baseline update; :mod:`._tickets` — the ticket step;
  :mod:`._select` — which nodes are idle; :mod:`._rules`, :mod:`._result` — the rules and the outcome.

Nothing here imports Prefect.
"""

from ..errors import JobRenderError, PayloadArgsError
from ._act import CONDITION, apply_decision, condition_patch, node_patch
from ._collect import CollectedResults, PodLog, collect_results, parse_pod_log, split_pod_log, validate_pod_logs
from ._decide import NodeDecision, decide_nodes, fail_stands
from ._jobs import (
    DEFAULT_IMAGE,
    JOBS_NAMESPACE,
    PAYLOAD_DIR,
    BenchmarkSettings,
    benchmark_job,
    check_payload_args,
    ensure_payload,
    job_name,
    pair_job,
    pair_name,
    payload_configmap,
    payload_items,
    payload_key,
    payload_path,
    policy_payload_args,
)
from ._links import LINK_NODES, LINK_PAIRS, link_plan, link_seed, plan_of, store_plan, stored_plan_of
from ._names import COMPONENT
from ._outcome import JobOutcome, abandon, classify, job_pods, observe
from ._record import common_stack, job_failure_verdicts, stack_changed_nodes, update_baselines
from ._result import CertifyOutcome, TicketChange
from ._rules import CertificationRules
from ._run import DECISIONS, POLICY, RESULTS, STACK, VERDICTS, CertificationRun, latest_decisions, rerun_id
from ._select import busy_nodes, choose_nodes
from ._settle import NodeTaints, RunVerdicts, SettledDecision, Settlement, fleet_taints, settle, settled_verdicts
from ._shards import ShardParts, plan_shards, read_shards, write_shard
from ._tickets import TicketStep, incident_summary, recorded_tickets, ticket_audit, ticket_step
from ._verdicts import link_findings, rerun_verdicts, run_verdicts, settle_offline, verdicts_with_links
from ._wave import PairRound, UnitRun, Wave, delete_jobs, orphaned_jobs, run_pair_round, run_wave

__all__ = [
    "COMPONENT",
    "CONDITION",
    "DECISIONS",
    "DEFAULT_IMAGE",
    "JOBS_NAMESPACE",
    "LINK_NODES",
    "LINK_PAIRS",
    "PAYLOAD_DIR",
    "POLICY",
    "RESULTS",
    "STACK",
    "VERDICTS",
    "BenchmarkSettings",
    "CertificationRules",
    "CertificationRun",
    "CertifyOutcome",
    "CollectedResults",
    "JobOutcome",
    "JobRenderError",
    "NodeDecision",
    "NodeTaints",
    "PairRound",
    "PayloadArgsError",
    "PodLog",
    "RunVerdicts",
    "SettledDecision",
    "Settlement",
    "ShardParts",
    "TicketChange",
    "TicketStep",
    "UnitRun",
    "Wave",
    "abandon",
    "apply_decision",
    "benchmark_job",
    "busy_nodes",
    "check_payload_args",
    "choose_nodes",
    "classify",
    "collect_results",
    "common_stack",
    "condition_patch",
    "decide_nodes",
    "delete_jobs",
    "ensure_payload",
    "fail_stands",
    "fleet_taints",
    "incident_summary",
    "job_failure_verdicts",
    "job_name",
    "job_pods",
    "latest_decisions",
    "link_findings",
    "link_plan",
    "link_seed",
    "node_patch",
    "observe",
    "orphaned_jobs",
    "pair_job",
    "pair_name",
    "parse_pod_log",
    "payload_configmap",
    "payload_items",
    "payload_key",
    "payload_path",
    "plan_of",
    "plan_shards",
    "policy_payload_args",
    "read_shards",
    "recorded_tickets",
    "rerun_id",
    "rerun_verdicts",
    "run_pair_round",
    "run_verdicts",
    "run_wave",
    "settle",
    "settle_offline",
    "settled_verdicts",
    "split_pod_log",
    "stack_changed_nodes",
    "store_plan",
    "stored_plan_of",
    "ticket_audit",
    "ticket_step",
    "update_baselines",
    "validate_pod_logs",
    "verdicts_with_links",
    "write_shard",
]
