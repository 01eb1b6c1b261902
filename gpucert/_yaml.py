"""Reading a YAML file a user wrote, one way everywhere: a policy, a kubeconfig, a fault document.

Every way such a file can be wrong — unreadable, not UTF-8, NUL bytes, not YAML, a key given twice (YAML
says keys are unique; PyYAML would silently keep the last), a list as a key, nesting too deep, not a
mapping — is one :class:`~gpucert.errors.InputError` line (or the caller's subclass) naming the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .errors import InputError

__all__ = ["UniqueKeyLoader", "read_yaml_mapping"]


class UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping and a key that is a list or mapping."""


def _unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, f"a {type(key).__name__} cannot be a key", key_node.start_mark
            ) from None
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def read_yaml_mapping(
    path: str | Path, where: str, *, what: str = "a mapping", error: type[InputError] = InputError
) -> dict[str, Any]:
    """The mapping the YAML file ``path`` holds (an empty file: ``{}``); raises ``error`` whose message starts
    with ``where`` (e.g. ``--kubeconfig k.yaml``) for any way the file is unusable."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise error(f"{where}: cannot read it ({exc.strerror or exc})") from None
    if b"\0" in data:
        raise error(f"{where}: holds NUL bytes; it is not a YAML text")
    try:
        loaded = yaml.load(data.decode("utf-8"), Loader=UniqueKeyLoader)  # a SafeLoader subclass
    except UnicodeDecodeError as exc:
        raise error(f"{where}: not UTF-8 text (byte {exc.start})") from None
    except yaml.YAMLError as exc:
        raise error(f"{where}: not valid YAML ({' '.join(str(exc).split())})") from None
    except RecursionError:
        raise error(f"{where}: not valid YAML: nested too deeply") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise error(f"{where}: must be {what}, got {type(loaded).__name__}")
    return loaded
