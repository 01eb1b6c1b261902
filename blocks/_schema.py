"""What every gpucert block's JSON schema adds to Prefect's: a saved block passed by reference validates.

Prefect accepts a block parameter either whole or as a reference (``{"$ref": {"block_document_id": …}}``,
what the UI, ``run_deployment`` and a deployment's ``{{ prefect.blocks.… }}`` default send) and checks it
against ``oneOf`` the block's schema and the reference's (``prefect.utilities.schema_tools``). A block
whose fields all have defaults, as each of gpucert's does, accepts any object — the reference too — so
the reference matched both and a deployment with ``enforce_parameter_schema`` refused every saved block
("is valid under each of"). The block's schema now says an object holding ``$ref`` is not the block
itself, leaving the reference one way to match.
"""

from __future__ import annotations

from typing import Any

from prefect.blocks.core import schema_extra

__all__ = ["block_schema_extra"]


def block_schema_extra(schema: dict[str, Any], model: type[Any]) -> None:
    """Prefect's block schema extras, and ``not: {required: [$ref]}`` (see the module docstring)."""
    schema_extra(schema, model)
    schema["not"] = {"required": ["$ref"]}
