"""Every error class gpucert raises is defined in ``gpucert.errors`` and drawn in its docstring's tree.

The tree is what a caller reads to know what to catch: a class raised somewhere in gpucert but missing
from it (or drawn under the wrong parent) is a class nobody knows to handle.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import subprocess
import sys

import gpucert
import gpucert.errors
from gpucert.errors import GpucertError

#: The benchmark payload keeps its own errors (it imports nothing else of gpucert): it is not walked. (The
#: simulator, gpucert_sim, is its own distribution outside the gpucert package.)
SKIPPED = ("gpucert.bench",)
#: One drawn line: the box-drawing prefix (4 characters a level) and the class's name.
TREE_LINE = re.compile(r"^ {4}((?:[│ ]   )*(?:[├└]── )?)([A-Z]\w*)(?:\s|$)")


def _import_every_module() -> None:
    for module in pkgutil.walk_packages(gpucert.__path__, "gpucert."):
        if not module.name.startswith(SKIPPED):
            importlib.import_module(module.name)


def _subclasses(cls: type[BaseException]) -> set[type[BaseException]]:
    found: set[type[BaseException]] = set()
    for sub in cls.__subclasses__():
        found |= {sub, *_subclasses(sub)}
    return found


def _gpucert_errors() -> dict[str, type[BaseException]]:
    """Every subclass of GpucertError that gpucert's own modules define, by name."""
    _import_every_module()
    classes = {cls for cls in _subclasses(GpucertError) if cls.__module__.startswith("gpucert.")}
    by_name = {cls.__name__: cls for cls in classes}
    assert len(by_name) == len(classes), "two error classes share a name"
    return by_name


def _drawn_tree() -> list[tuple[int, str, str]]:
    """The tree in gpucert.errors' docstring: (depth, class name, the whole line) per class, in order."""
    lines = (gpucert.errors.__doc__ or "").splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r" {4}GpucertError(\s|$)", line))
    drawn = []
    for line in lines[start:]:
        if not line.strip():
            break
        match = TREE_LINE.match(line)
        assert match, f"not a tree line: {line!r}"
        drawn.append((len(match.group(1)) // 4, match.group(2), line))
    return drawn


def test_every_error_class_is_defined_in_gpucert_errors_and_listed() -> None:
    errors = _gpucert_errors()
    assert {"KubeError", "LeaseLost", "TicketError", "StackRenderError", "PayloadArgsError"} <= set(errors)
    for name, cls in sorted(errors.items()):
        assert getattr(gpucert.errors, name, None) is cls, f"{name} is not gpucert.errors.{name}"
        assert cls.__module__ == "gpucert.errors", f"{name} is defined in {cls.__module__}"
        assert name in gpucert.errors.__all__, f"{name} is not in gpucert.errors.__all__"


def test_every_error_class_is_drawn_once_under_its_parent() -> None:
    errors = _gpucert_errors()
    drawn = _drawn_tree()
    names = [name for _, name, _ in drawn]
    assert sorted(names) == sorted({*errors, "GpucertError"}), "the drawn tree and the classes differ"
    parents: list[str] = []
    for depth, name, line in drawn:
        del parents[depth:]
        cls = getattr(gpucert.errors, name)
        if parents:
            parent = getattr(gpucert.errors, parents[-1])
            assert cls.__bases__[0] is parent, f"{name} is drawn under {parents[-1]}, its first base is not"
            # A second base (InputError: exit 2; ValueError) changes how a caller catches it: the line says so.
            for other in cls.__bases__[1:]:
                assert re.search(rf"\balso\b.*\b{other.__name__}\b", line), f"{name}'s line omits {other.__name__}"
        parents.append(name)


def test_package_names_are_the_same_class_objects() -> None:
    # Moving a class into gpucert.errors must not split it in two: code catching the package's name
    # catches what the package raises.
    from gpucert import certify, kube, stack, store, telemetry, tickets

    for package in (certify, kube, stack, store, telemetry, tickets):
        for name in package.__all__:
            value = getattr(package, name)
            if isinstance(value, type) and issubclass(value, GpucertError):
                assert value is getattr(gpucert.errors, name), f"{package.__name__}.{name}"


def test_importing_the_errors_is_cheap() -> None:
    # Every part of gpucert imports this module, the command line first: it must bring no heavy library.
    heavy = ("pandas", "kubernetes", "boto3", "httpx", "pyarrow", "jinja2")
    code = f"import sys, gpucert.errors; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
