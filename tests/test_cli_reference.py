"""docs/reference/cli.md is the parser's own help (scripts/cli_reference.py): a changed option fails here until
the reference is written again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_cli_reference_is_what_the_parser_says() -> None:
    checked = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "cli_reference.py"), "--check"],
        check=False,
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stderr


def test_a_stale_reference_is_caught(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import cli_reference
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    stale = tmp_path / "cli.md"
    stale.write_text(cli_reference.render().replace("--timeout SECONDS", "--timeout SECS"), encoding="utf-8")
    original, cli_reference.REFERENCE = cli_reference.REFERENCE, stale
    try:
        assert cli_reference.main(["--check"]) == 1
    finally:
        cli_reference.REFERENCE = original
