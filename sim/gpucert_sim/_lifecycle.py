"""``gpucert demo``: the whole lifecycle on the embedded default, for real.

A local Prefect server (SQLite, in the work folder), a simulated 16-node cluster, a ``file://`` store:
configure → certify (two faults caught) → a night of operate in which a new fault appears and is caught
→ a new node onboarded through Prefect's REST API (``create_flow_run`` on the ``onboard-node``
deployment, served by a runner in this process). It prints what was found and where everything is, then
leaves the Prefect UI running to browse (Ctrl-C stops it all) — or, with ``--no-ui``, exits.

This is the command line's side (it imports Prefect, lazily); the flows are the production ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpucert._text import counted
from gpucert.errors import GpucertError

__all__ = ["run_lifecycle_demo"]

_SERVER_START_S = 180.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _prefect_server(home: Path) -> Iterator[str]:
    """A Prefect server on a free local port with its SQLite database under ``home``; yields its API URL."""
    import httpx

    port = _free_port()
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        "PREFECT_UI_API_URL": f"http://127.0.0.1:{port}/api",
    }
    env.pop("PREFECT_API_URL", None)
    log = (home / "server.log").open("wb")
    prefect = str(Path(sys.executable).with_name("prefect"))
    process = subprocess.Popen(
        [prefect, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + _SERVER_START_S
        while True:
            if process.poll() is not None:
                raise GpucertError(f"the Prefect server stopped at start; see {home / 'server.log'}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise GpucertError(
                    f"the Prefect server did not answer in {_SERVER_START_S:g} s; see {home / 'server.log'}"
                )
            time.sleep(0.5)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        log.close()


@contextlib.contextmanager
def _serving_files(folder: Path) -> Iterator[str]:
    """Serve ``folder`` read-only over HTTP on a free local port; yields its URL. The report links of a
    ``file://`` store then open from the Prefect UI, as a bucket's presigned links do in production."""
    import functools
    import http.server

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            del format, args

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, name="gpucert-demo-files", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def _serving(flow: Any, name: str) -> Iterator[None]:
    """Serve ``flow`` as deployment ``name`` from a runner on a thread of its own (polls every second)."""
    from prefect.runner import Runner
    from prefect.types.entrypoint import EntrypointType

    runner = Runner(name="gpucert-demo", query_seconds=1, pause_on_shutdown=False)
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    async def main() -> None:
        # By module path: the run loads ``flows.onboard`` as the installed package has it, wherever this runs.
        await runner.add_flow(flow, name=name, entrypoint_type=EntrypointType.MODULE_PATH)  # type: ignore[misc]
        ready.set()
        await runner.start()

    async def stop() -> None:
        await runner.stop()  # type: ignore[misc]

    thread = threading.Thread(target=lambda: loop.run_until_complete(main()), daemon=True)
    thread.start()
    ready.wait(60)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout=20)
        thread.join(timeout=20)


def run_lifecycle_demo(*, workdir: str, nodes: int = 16, seed: int = 7, ui: bool = True) -> int:
    """Run the lifecycle (see the module docstring); returns 0 once done (after Ctrl-C with the UI)."""
    from rich.console import Console

    console = Console()
    root = Path(workdir).resolve()
    if root.exists():
        shutil.rmtree(root)
    (root / "prefect").mkdir(parents=True)
    store_uri = f"file://{root / 'store'}"
    started = time.monotonic()
    console.print(f"[bold]gpucert demo[/]: work folder {root}")
    (root / "store").mkdir()
    with _prefect_server(root / "prefect") as api, _serving_files(root / "store") as files:
        os.environ.update(
            {
                "PREFECT_API_URL": api,
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "DO_NOT_TRACK": "1",
                "PREFECT_LOGGING_LEVEL": "WARNING",
                "GPUCERT_STORE": store_uri,
                "GPUCERT_STORE_PUBLIC_URL": files,
            }
        )
        console.print(f"Prefect server up at {api.removesuffix('/api')} ({time.monotonic() - started:.0f} s)")
        summary = _lifecycle(console, root, nodes=nodes, seed=seed, api=api)
        console.print(f"\nDone in {time.monotonic() - started:.0f} s.")
        for line in summary:
            console.print(line, markup=False, highlight=False)  # titles hold "[replacement]": not markup
        if ui:
            console.print(f"\nThe Prefect UI is at [bold]{api.removesuffix('/api')}[/]: Ctrl-C stops the demo.")
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)
    return 0


def _lifecycle(console: Any, root: Path, *, nodes: int, seed: int, api: str) -> list[str]:
    import httpx

    from gpucert.blocks.cluster import GpuCluster
    from gpucert.blocks.store import StoreLocation
    from gpucert.flows.certify import certify
    from gpucert.flows.configure import configure
    from gpucert.flows.onboard import idempotency_key, onboard
    from gpucert.flows.operate import operate
    from gpucert.kube import connect

    from . import SimCluster
    from .fleet import Fault

    with SimCluster(nodes=nodes, seed=seed, kubeconfig=root / "kubeconfig") as sim:
        os.environ["KUBECONFIG"] = str(sim.kubeconfig_path)
        cluster = GpuCluster(kubeconfig=str(sim.kubeconfig_path))
        store = StoreLocation.default()  # the store, and where its files are served (report links)
        names = sim.fleet.node_names
        kube = connect(sim.kubeconfig_path)

        configured = configure(cluster=cluster, rollout_timeout_s=120)
        console.print(
            f"1. configure: release {configured.release}, {configured.gpus_verified} GPUs advertised "
            f"on {len(configured.nodes)} nodes, drift {len(configured.drift)}"
        )

        # Three faults in all: the blast radius lets gpucert's taints cover max(3, 10 %) of 16 nodes, no more.
        first = [Fault("pcie_gen4", names[1], 3), Fault("remap_failure", names[5], 6)]
        for fault in first:
            sim.inject_fault(fault)
        certified = asyncio.run(certify(cluster=cluster, store=store, run_id="demo-certify"))
        console.print(f"2. certify with {len(first)} faults injected: {certified.states}; tainted {certified.tainted}")

        night_fault = Fault("nvlink_one_down", names[12], 0)
        sim.inject_fault(night_fault)
        night = asyncio.run(operate(cluster=cluster, store=store, rotation_days=0.0, scrape_interval_s=1.0))
        tonight = night.certify
        found = f"{tonight.states}; newly tainted {tonight.tainted}" if tonight else "nothing was due"
        console.print(f"3. operate, a new fault tonight ({night_fault.kind} on {night_fault.node}): {found}")

        [new] = sim.add_nodes(1, uncertified_taint="gpucert.io/uncertified")
        uid = kube.get("v1", "Node", new)["metadata"]["uid"]
        with _serving(onboard, "onboard-node"):
            answer = httpx.get(f"{api}/deployments/name/onboard-node/onboard-node", timeout=10)
            answer.raise_for_status()
            body = {"parameters": {"node": new, "uid": uid}, "idempotency_key": idempotency_key(new, uid)}
            url = f"{api}/deployments/{answer.json()['id']}/create_flow_run"
            for attempt in range(5):  # a busy SQLite server answers 503 now and then; the key makes retries safe
                created = httpx.post(url, json=body, timeout=30)
                if created.status_code < 500:
                    break
                time.sleep(1 + attempt)
            if created.status_code >= 300:
                raise GpucertError(f"create_flow_run answered {created.status_code}: {created.text[:500]}")
            state = _wait_for_run(api, created.json()["id"])
        node = kube.get("v1", "Node", new)
        admitted = not [t for t in node["spec"].get("taints") or [] if t["key"].startswith("gpucert.io/")]
        console.print(
            f"4. onboard {new} through the REST API: run {state}, "
            f"state {node['metadata']['labels'].get('gpucert.io/state')}, admitted {admitted}"
        )

        agreement = decisions_agree(kube, store.open())
        audited = audit_agrees(kube, store.open())
        injected = {f.node for f in [*first, night_fault]}
        also = sorted(tainted_nodes(kube) - injected)
        tainted = tainted_nodes(kube)
        from gpucert.tickets import open_backend, title_of

        open_tickets = open_backend(os.environ["GPUCERT_STORE"]).tickets(state="open")
        caught = "all caught" if injected <= tainted else f"MISSED: {', '.join(sorted(injected - tainted))}"
        return [
            f"Faults injected on {counted(len(injected), 'node')}: {', '.join(sorted(injected))} — {caught}",
            f"Nodes tainted unhealthy: {', '.join(sorted(tainted)) or 'none'}"
            + (f" (not injected, found by peers: {', '.join(also)} — the fleet model's slow silicon)" if also else ""),
            f"Tickets open ({len(open_tickets)}): " + "; ".join(f"{t.id} {title_of(t)}" for t in open_tickets),
            f"   (gpucert tickets list --store {os.environ['GPUCERT_STORE']})",
            f"Reports: {certified.report_link}" + (f" and {tonight.report_link}" if tonight else ""),
            agreement,
            audited,
            f"Store: {os.environ['GPUCERT_STORE']}; kubeconfig of the simulated cluster: {sim.kubeconfig_path}",
        ]


def decisions_agree(kube: Any, store: Any) -> str:
    """One line: whether every node's state label is its latest decision on record (decisions.parquet)."""
    from gpucert.certify import latest_decisions
    from gpucert.kube import node_name

    decided = latest_decisions(store)
    latest = dict(zip(decided["node"], decided["state"], strict=True))
    labels = {node_name(n): (n["metadata"].get("labels") or {}).get("gpucert.io/state") for n in kube.nodes()}
    wrong = sorted(n for n, state in latest.items() if labels.get(n) != state)
    if wrong:
        return f"DISAGREE: the state label of {', '.join(wrong)} is not its decision on record"
    return f"Decisions on record agree with every node's state label ({counted(len(latest), 'node')})"


def audit_agrees(kube: Any, store: Any) -> str:
    """One line: whether the store's audit trail checks out, and every taint gpucert set has its entry and
    its Event on the node."""
    from gpucert.audit import CONTROLLER, AuditLog

    checked = AuditLog(store.objects).check()
    if not checked.ok:
        return f"AUDIT BROKEN: {checked.problem}"
    added = [e for e in checked.entries if e["action"] == "taint.add" and e["object"]["kind"] == "Node"]
    events = kube.list_objects("events.k8s.io/v1", "Event", namespace="default")
    sent = {
        (e["regarding"]["name"], e["metadata"]["name"].rsplit(".", 1)[-1])
        for e in events
        if e.get("reportingController") == CONTROLLER and e.get("reason") == "TaintAdded"
    }
    unsent = [e for e in added if (e["object"]["name"], e["hash"][:16]) not in sent]
    if unsent:
        return f"AUDIT: {len(unsent)} of {counted(len(added), 'taint')} recorded have no Event on their node"
    return (
        f"Audit trail intact: {counted(len(checked.entries), 'change')} recorded; each of the "
        f"{counted(len(added), 'taint')} "
        "set has its entry and its Event on the node (gpucert audit show --store …)"
    )


def tainted_nodes(kube: Any) -> set[str]:
    """The nodes carrying gpucert's ``unhealthy`` taint."""
    from gpucert.kube import has_taint, node_name, unhealthy_taint

    return {node_name(n) for n in kube.nodes() if has_taint(n, unhealthy_taint("gpucert.io"))}


def _wait_for_run(api: str, run_id: str, timeout_s: float = 180.0) -> str:
    import httpx

    deadline = time.monotonic() + timeout_s
    state = "PENDING"
    while time.monotonic() < deadline:
        state = httpx.get(f"{api}/flow_runs/{run_id}", timeout=10).json()["state"]["type"]
        if state in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            return str(state)
        time.sleep(1)
    return f"{state} after {timeout_s:g} s"
