"""``gpucert demo --no-ui``, the README's main command without the UI, end to end as a user runs it: a real
Prefect server, the simulated cluster, configure → certify → a night of operate → onboarding by REST."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_the_lifecycle_demo_runs_and_catches_every_injected_fault(tmp_path: Path) -> None:
    gpucert = str(Path(sys.executable).with_name("gpucert"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    done = subprocess.run(
        [gpucert, "demo", "--no-ui", "--workdir", str(tmp_path / "demo")],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    out = " ".join(done.stdout.split())  # rich wraps long lines
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1. configure: release" in out
    assert "run COMPLETED, state certified, admitted True" in out
    assert "all caught" in out
    assert (tmp_path / "demo" / "store" / "baselines" / "current").exists()
