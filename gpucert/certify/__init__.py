"""certify's core: benchmark Jobs on the cluster, their outcome, and the results they logged.

* :mod:`._jobs` — the benchmark units' objects (``templates/certify/``): a node's Job
  (:func:`benchmark_job`, named by :func:`job_name`), a pair's Indexed Job and headless Service
  (:func:`pair_job`, :class:`PairJob`), the payload (:func:`payload_configmap`), :class:`BenchmarkSettings`;
* :mod:`._outcome` — :func:`classify` a Job and its pods into a :class:`JobOutcome` (a failure outside
  the GPU — image pull, unschedulable, OOM, deadline — is ``inconclusive`` for that node, never a GPU
  verdict); :func:`observe` and :func:`abandon` do it through :class:`gpucert.kube.Kube`;
* :mod:`._collect` — :func:`collect_results` reads a succeeded pod's log, keeps the results rows,
  validates them (:mod:`gpucert.results`) and checks they are the Job's run and node; a wave reads its
  logs with :func:`read_pod_log` and validates them together with :func:`validate_pod_logs`.

* :mod:`._wave` — one bounded async wave for both units, adopting its own Jobs on a restart and holding
  its nodes' Leases: :func:`run_wave`, a Job per node (:class:`Wave`); :func:`run_pair_round`, one round
  of disjoint pair Jobs, both pods' rows kept (:class:`PairRound`);
* :mod:`._run` — :class:`CertificationRun`: a run's files in the store (results, verdicts, decisions,
  stack, report) and its confirming re-runs;
* :mod:`._decide` — one run's verdicts → :class:`NodeDecision` per node; :mod:`._settle` —
  :func:`settle`: the first run and its re-runs → one :class:`SettledDecision` per node (confirmation,
  taints, the blast radius, observe-only), written as ``decisions.parquet``;
* :mod:`._act` — writing decisions to nodes (labels, annotations, taints, the ``GpuCertified``
  condition); :mod:`._select` — which nodes are idle;
* :mod:`._record` — inconclusive rows for failed Jobs, the baseline update; :mod:`._tickets` — the
  ticket step (recorded in the store when no backend is configured);
* :mod:`._shards` — :func:`plan_shards` cuts a large run's nodes into shards that any Prefect worker runs,
  :func:`write_shard` / :func:`read_shards` their files, joined into the run's results;
* :mod:`._links` — a run's links: :func:`link_plan` by the nodes' topology labels, stored with the run,
  and :func:`judge_with_links`: GPU and node rows by the verdict engine, pair rows by the plan;
* :mod:`._rules` — :class:`CertificationRules`; :mod:`._result` — :class:`CertifyOutcome`.

Nothing here imports Prefect.
"""

from ._act import CONDITION, NodeChange, apply_decision, condition_patch, node_patch
from ._collect import (
    BENCH_PREFIX,
    DCGM_PREFIX,
    STACK_PREFIX,
    CollectedResults,
    PodLog,
    collect_results,
    parse_pod_log,
    read_pod_log,
    split_pod_log,
    validate_pod_logs,
)
from ._decide import HARD_GATE_XIDS, NodeDecision, decide_nodes, fail_stands
from ._jobs import (
    DEFAULT_IMAGE,
    JOB_TEMPLATE,
    JOBS_NAMESPACE,
    PAIR_PORT,
    PAYLOAD_DIR,
    PAYLOAD_TEMPLATE,
    BenchmarkSettings,
    JobRenderError,
    PairJob,
    PayloadArgsError,
    benchmark_job,
    check_payload_args,
    ensure_payload,
    job_labels,
    job_name,
    pair_job,
    pair_name,
    payload_configmap,
    payload_items,
    payload_key,
    payload_path,
    policy_payload_args,
)
from ._judge import judge_rerun, run_verdicts, settle_offline
from ._links import (
    LINK_NODES,
    LINK_PAIRS,
    judge_links,
    judge_with_links,
    link_plan,
    link_seed,
    plan_of,
    store_plan,
    stored_plan_of,
)
from ._names import COMMON_LABELS, COMPONENT, DEFAULT_LABEL_PREFIX
from ._outcome import REASONS, STATES, JobOutcome, Reason, State, abandon, classify, job_pods, observe
from ._record import common_stack, job_failure_verdicts, stack_changed_nodes, update_baselines
from ._result import CertifyOutcome, NodeOutcome, TicketChange
from ._rules import CertificationRules
from ._run import DECISIONS, POLICY, RESULTS, RUN_FILES, STACK, VERDICTS, CertificationRun, latest_decisions, rerun_id
from ._select import busy_nodes, choose_nodes
from ._settle import (
    DECISION_COLUMNS,
    NodeTaints,
    RunVerdicts,
    SettledDecision,
    Settlement,
    TaintAction,
    fleet_taints,
    settle,
    settled_verdicts,
)
from ._shards import ShardParts, plan_shards, read_shards, write_shard
from ._tickets import TicketStep, held_back, incident_summary, pending_runs, recorded_tickets, ticket_audit, ticket_step
from ._wave import (
    NodeRun,
    PairRound,
    PairRun,
    Wave,
    delete_jobs,
    orphaned_jobs,
    run_pair_round,
    run_wave,
    sweep_orphans,
)

__all__ = [
    "BENCH_PREFIX",
    "COMMON_LABELS",
    "COMPONENT",
    "CONDITION",
    "DCGM_PREFIX",
    "DECISIONS",
    "DECISION_COLUMNS",
    "DEFAULT_IMAGE",
    "DEFAULT_LABEL_PREFIX",
    "HARD_GATE_XIDS",
    "JOBS_NAMESPACE",
    "JOB_TEMPLATE",
    "LINK_NODES",
    "LINK_PAIRS",
    "PAIR_PORT",
    "PAYLOAD_DIR",
    "PAYLOAD_TEMPLATE",
    "POLICY",
    "REASONS",
    "RESULTS",
    "RUN_FILES",
    "STACK",
    "STACK_PREFIX",
    "STATES",
    "VERDICTS",
    "BenchmarkSettings",
    "CertificationRules",
    "CertificationRun",
    "CertifyOutcome",
    "CollectedResults",
    "JobOutcome",
    "JobRenderError",
    "NodeChange",
    "NodeDecision",
    "NodeOutcome",
    "NodeRun",
    "NodeTaints",
    "PairJob",
    "PairRound",
    "PairRun",
    "PayloadArgsError",
    "PodLog",
    "Reason",
    "RunVerdicts",
    "SettledDecision",
    "Settlement",
    "ShardParts",
    "State",
    "TaintAction",
    "TicketChange",
    "TicketStep",
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
    "held_back",
    "incident_summary",
    "job_failure_verdicts",
    "job_labels",
    "job_name",
    "job_pods",
    "judge_links",
    "judge_rerun",
    "judge_with_links",
    "latest_decisions",
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
    "pending_runs",
    "plan_of",
    "plan_shards",
    "policy_payload_args",
    "read_pod_log",
    "read_shards",
    "recorded_tickets",
    "rerun_id",
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
    "sweep_orphans",
    "ticket_audit",
    "ticket_step",
    "update_baselines",
    "validate_pod_logs",
    "write_shard",
]
