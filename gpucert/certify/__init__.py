"""certify's core: benchmark Jobs on the cluster, their outcome, and the results they logged.

* :mod:`._jobs` — :func:`benchmark_job` and :func:`payload_configmap` (``templates/certify/``), the
  Job's name (:func:`job_name`) and labels, :class:`BenchmarkSettings`;
* :mod:`._outcome` — :func:`classify` a Job and its pods into a :class:`JobOutcome` (a failure outside
  the GPU — image pull, unschedulable, OOM, deadline — is ``inconclusive`` for that node, never a GPU
  verdict); :func:`observe` and :func:`abandon` do it through :class:`gpucert.kube.Kube`;
* :mod:`._collect` — :func:`collect_results` reads a succeeded pod's log, keeps the results rows,
  validates them (:mod:`gpucert.results`) and checks they are the Job's run and node.

* :mod:`._wave` — :func:`run_wave`: a Job per node, bounded, async, adopting its own Jobs on a restart;
* :mod:`._decide` — verdicts → :class:`NodeDecision` (state, taint cause, hard gate, 2-of-3 confirmation,
  blast radius); :mod:`._act` — writing them to nodes; :mod:`._select` — which nodes are idle;
* :mod:`._record` — inconclusive rows for failed Jobs, the baseline update.

Nothing here imports Prefect.
"""

from ._act import NodeChange, apply_decision, node_patch
from ._collect import (
    BENCH_PREFIX,
    DCGM_PREFIX,
    STACK_PREFIX,
    CollectedResults,
    collect_results,
    parse_pod_log,
)
from ._decide import HARD_GATE_XIDS, NodeDecision, blast_radius_limit, decide_nodes, fail_stands, tally
from ._jobs import (
    DEFAULT_IMAGE,
    JOB_TEMPLATE,
    JOBS_NAMESPACE,
    PAYLOAD_DIR,
    PAYLOAD_TEMPLATE,
    BenchmarkSettings,
    JobRenderError,
    benchmark_job,
    ensure_payload,
    job_labels,
    job_name,
    payload_configmap,
    payload_items,
    payload_key,
    payload_path,
)
from ._names import COMMON_LABELS, COMPONENT, DEFAULT_LABEL_PREFIX
from ._outcome import REASONS, STATES, JobOutcome, Reason, State, abandon, classify, job_pods, observe
from ._record import (
    common_stack,
    job_failure_verdicts,
    read_run_results,
    read_run_verdicts,
    stack_changed_nodes,
    update_baselines,
    write_run_table,
)
from ._select import busy_nodes, choose_nodes
from ._wave import NodeRun, Wave, delete_jobs, orphaned_jobs, run_wave

__all__ = [
    "BENCH_PREFIX",
    "COMMON_LABELS",
    "COMPONENT",
    "DCGM_PREFIX",
    "DEFAULT_IMAGE",
    "DEFAULT_LABEL_PREFIX",
    "HARD_GATE_XIDS",
    "JOBS_NAMESPACE",
    "JOB_TEMPLATE",
    "PAYLOAD_DIR",
    "PAYLOAD_TEMPLATE",
    "REASONS",
    "STACK_PREFIX",
    "STATES",
    "BenchmarkSettings",
    "CollectedResults",
    "JobOutcome",
    "JobRenderError",
    "NodeChange",
    "NodeDecision",
    "NodeRun",
    "Reason",
    "State",
    "Wave",
    "abandon",
    "apply_decision",
    "benchmark_job",
    "blast_radius_limit",
    "busy_nodes",
    "choose_nodes",
    "classify",
    "collect_results",
    "common_stack",
    "decide_nodes",
    "delete_jobs",
    "ensure_payload",
    "fail_stands",
    "job_failure_verdicts",
    "job_labels",
    "job_name",
    "job_pods",
    "node_patch",
    "observe",
    "orphaned_jobs",
    "parse_pod_log",
    "payload_configmap",
    "payload_items",
    "payload_key",
    "payload_path",
    "read_run_results",
    "read_run_verdicts",
    "run_wave",
    "stack_changed_nodes",
    "tally",
    "update_baselines",
    "write_run_table",
]
