"""An import-linter contract of our own: no package imports another package's private modules.

import-linter's wildcards replace whole module names only, so "``gpucert.kube._*`` from outside
``gpucert.kube``" cannot be written as a ``forbidden`` contract. This one walks the import graph: an import
of ``<container>.<package>._<name>`` (at any depth below it) from a module outside ``<container>.<package>``
breaks it. Modules directly under the container (``gpucert._io``) are the container's own helpers, shared
by its packages, and are not checked. Registered in ``.importlinter`` as ``private_modules``.
"""

from __future__ import annotations

from grimp import ImportGraph
from importlinter import Contract, ContractCheck, fields, output


def _owner(module: str, container: str) -> str | None:
    """The package below ``container`` whose private module ``module`` is, or None if it is not one."""
    parts = module[len(container) + 1 :].split(".")
    if len(parts) < 2 or not any(part.startswith("_") and not part.startswith("__") for part in parts[1:]):
        return None
    return f"{container}.{parts[0]}"


class PrivateModulesContract(Contract):
    type_name = "private_modules"

    container = fields.StringField()

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        container = str(self.container)
        broken = []
        for imported in sorted(graph.modules):
            if not imported.startswith(container + "."):
                continue
            owner = _owner(imported, container)
            if owner is None:
                continue
            for importer in sorted(graph.find_modules_that_directly_import(imported)):
                if importer == owner or importer.startswith(owner + "."):
                    continue
                lines = sorted(
                    detail["line_number"] for detail in graph.get_import_details(importer=importer, imported=imported)
                )
                broken.append({"importer": importer, "imported": imported, "lines": lines})
        return ContractCheck(kept=not broken, metadata={"broken": broken})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for item in check.metadata["broken"]:
            where = ", ".join(f"l.{line}" for line in item["lines"])
            output.print_error(f"{item['importer']} -> {item['imported']} ({where})", bold=False)
            output.new_line()
