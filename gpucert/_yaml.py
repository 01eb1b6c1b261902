"""Reading a YAML file a user wrote, one way everywhere: a policy, a kubeconfig, a fault document. Every way
such a file can be wrong (unreadable, not UTF-8, NUL bytes, not YAML, a key given twice — PyYAML would keep
the last —, a list as a key, nested too deep, an alias bomb or cycle, not a mapping) is one
:class:`~gpucert.errors.InputError` line (or the caller's subclass) naming the file.

Why aliases are bounded: PyYAML builds an alias as a second reference to one object, so loading a bomb is
cheap, but whatever walks the result afterwards (pydantic, the Kubernetes client's loader, ``json.dumps``)
meets every reference as a full copy: nine levels of nine aliases are 387 million strings. The document is
weighed as if expanded, in linear time, and refused past :data:`MAX_EXPANDED` or twice its own size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import yaml

from .errors import InputError

__all__ = ["MAX_EXPANDED", "AliasBomb", "UniqueKeyLoader", "read_yaml_mapping"]

#: The most a document may weigh with every alias expanded (each node 1, each scalar its characters too)
#: beyond twice its own weight: far above any policy, kubeconfig or matrix (the shipped matrix weighs
#: about 3,700), far below what makes a consumer of the loaded data take seconds.
MAX_EXPANDED: Final = 1_000_000


class AliasBomb(yaml.YAMLError):
    """The document's aliases expand it beyond :data:`MAX_EXPANDED`, or an alias is inside its own anchor."""


class UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping, a key that is a list or mapping, and
    aliases that expand the document beyond :data:`MAX_EXPANDED`, and a node holding an alias of itself."""

    def compose_document(self) -> yaml.Node | None:
        node: yaml.Node | None = super().compose_document()
        if node is not None:
            _check_expansion(node)
        return node


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _check_expansion(root: yaml.Node) -> None:
    """Raise :class:`AliasBomb` when ``root`` expanded would weigh more than :data:`MAX_EXPANDED` and twice
    its own weight, or holds a cycle (an alias inside the node its anchor names).

    Each distinct node is weighed once (an alias is the same node object again), depth first without
    recursion, so a deep or aliased document costs time linear in its composed size.
    """
    expanded: dict[int, int] = {}  # id(node) → its weight with every alias expanded
    on_path: set[int] = set()
    own = 0  # the weight of the distinct nodes: the document as written
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            on_path.discard(key)
            weight = 1 + (len(node.value) if isinstance(node, yaml.ScalarNode) else 0)
            own += weight
            weight += sum(expanded[id(child)] for child in _children(node))
            expanded[key] = weight
            if weight > max(MAX_EXPANDED, 2 * own):
                raise AliasBomb(
                    f"its aliases expand it beyond {MAX_EXPANDED:,} nodes and characters (line "
                    f"{node.start_mark.line + 1}): a YAML alias bomb?"
                )
            continue
        if key in expanded:
            continue
        if key in on_path:
            raise AliasBomb(f"the node at line {node.start_mark.line + 1} holds an alias of itself")
        on_path.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in expanded)


_MERGE_TAG: Final = "tag:yaml.org,2002:merge"


def _unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:
            continue  # ``<<: *defaults``: construct_mapping merges it (the keys given here winning)
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
    except AliasBomb as exc:
        raise error(f"{where}: refused: {exc}") from None
    except yaml.YAMLError as exc:
        raise error(f"{where}: not valid YAML ({' '.join(str(exc).split())})") from None
    except RecursionError:
        raise error(f"{where}: not valid YAML: nested too deeply") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise error(f"{where}: must be {what}, got {type(loaded).__name__}")
    return loaded
