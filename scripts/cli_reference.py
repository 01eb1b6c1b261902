"""Write docs/reference/cli.md from gpucert's argparse parser, so the reference is the help the program prints.

    python scripts/cli_reference.py          # rewrite docs/reference/cli.md
    python scripts/cli_reference.py --check  # exit 1 when the file is not what the parser says (CI's test)

argparse keeps its actions and sub-parsers in private attributes; reading them is the only way to walk a parser,
and a change there would fail tests/test_cli_reference.py at once, not silently.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpucert.cli import _parser

REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "cli.md"
HEADER = [
    "# Command line reference",
    "",
    "Generated from the argparse parser in `gpucert/cli.py` by `scripts/cli_reference.py`; "
    "`gpucert COMMAND --help` prints the same.",
    "Exit statuses: [exit-codes.md](exit-codes.md).",
    "",
]


def _subcommands(parser: argparse.ArgumentParser) -> list[argparse._SubParsersAction[argparse.ArgumentParser]]:
    return [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _row(action: argparse.Action) -> str:
    """One table row: the option (or positional) with its metavar or choices, then its help and default."""
    name = ", ".join(action.option_strings) if action.option_strings else str(action.metavar or action.dest)
    if action.option_strings and action.nargs != 0 and not (action.choices and action.metavar is None):
        metavar = action.metavar or action.dest.upper()
        name += " " + (" ".join(metavar) if isinstance(metavar, tuple) else metavar)
    if action.choices:
        name += " {" + ",".join(map(str, action.choices)) + "}"
    meaning = (action.help or "").replace("%(default)s", str(action.default))
    shows_default = action.default not in (None, False, [], argparse.SUPPRESS) and "default" not in meaning
    if action.option_strings and shows_default:
        meaning += f" (default: {action.default})"
    if action.option_strings and action.required:
        meaning += " — required"
    return f"| `{_cell(name)}` | {_cell(meaning)} |"


def _section(parser: argparse.ArgumentParser, path: list[str], level: int) -> list[str]:
    out = [f"{'#' * level} `{' '.join(path)}`", ""]
    if parser.description:
        out += [" ".join(parser.description.split()), ""]
    rows = [_row(a) for a in parser._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]
    if rows:
        out += ["| argument | meaning |", "|---|---|", *rows, ""]
    for group in _subcommands(parser):
        helps = {c.dest: c.help for c in group._choices_actions}
        for name, child in group.choices.items():
            if child.description is None and helps.get(name):
                child.description = helps[name]
            out += _section(child, [*path, name], min(level + 1, 4))
    return out


def render() -> str:
    """docs/reference/cli.md as the parser says it should be."""
    return "\n".join(HEADER + _section(_parser(), ["gpucert"], 2))


def main(argv: list[str]) -> int:
    text = render()
    if argv == ["--check"]:
        if REFERENCE.read_text(encoding="utf-8") != text:
            print(f"{REFERENCE} is stale: run `python scripts/cli_reference.py`", file=sys.stderr)
            return 1
        return 0
    REFERENCE.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
