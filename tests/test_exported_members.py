"""gpucert's public surface is the list in ``gpucert.__all__``: every name resolves, each is what the
docs promise, and nothing joins or leaves the list without this test changing with it."""

from __future__ import annotations

import importlib
import importlib.resources
import inspect
import subprocess
import sys

import pytest

import gpucert
import gpucert.errors

PUBLIC = {
    "BaselineStore",
    "BuildReport",
    "GpucertError",
    "InputError",
    "Policy",
    "PolicyError",
    "ResultsError",
    "RunEvaluation",
    "SettledDecision",
    "Settlement",
    "StoreError",
    "VersionInfo",
    "__version__",
    "build_baseline",
    "build_certificate",
    "concat_results",
    "default_policy",
    "evaluate_run",
    "judge",
    "load_policy",
    "open_store",
    "read_results",
    "settle_offline",
    "verify_certificate",
    "write_results",
}


def test_the_public_surface_is_the_pinned_list() -> None:
    assert set(gpucert.__all__) == PUBLIC
    assert 10 <= len(gpucert.__all__) <= 40
    assert len(gpucert.__all__) == len(set(gpucert.__all__))


def test_every_public_name_resolves_to_its_home_module() -> None:
    for name in gpucert.__all__:
        value = getattr(gpucert, name)
        if name == "__version__":
            assert isinstance(value, str)
            continue
        home = inspect.getmodule(value)
        assert home is not None, name
        assert home.__name__.startswith("gpucert."), name
        # Defined in gpucert (not a re-export of a third party's name) and public where it lives.
        assert not any(part.startswith("_") for part in value.__module__.split(".")[1:-1]), name


def test_unknown_names_are_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="not_a_name"):
        gpucert.not_a_name  # noqa: B018


def test_importing_gpucert_imports_none_of_its_heavy_parts() -> None:
    # The command line imports gpucert first: the surface must not drag pandas or boto3 into every start.
    code = "import sys, gpucert; print(sorted(m for m in ('pandas', 'boto3', 'kubernetes') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_public_error_is_in_the_drawn_tree() -> None:
    tree = gpucert.errors.__doc__ or ""
    for name in gpucert.__all__:
        value = getattr(gpucert, name)
        if inspect.isclass(value) and issubclass(value, BaseException):
            assert f" {name} " in tree or f"{name}\n" in tree, name
            assert getattr(gpucert.errors, name) is value


def test_py_typed_ships() -> None:
    assert importlib.resources.files("gpucert").joinpath("py.typed").is_file()
