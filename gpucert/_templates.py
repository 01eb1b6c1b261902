"""The Jinja2 environment every template of ``templates/`` renders in.

Two rules keep values read from a cluster (node names, labels, annotations) from bending a manifest:
``StrictUndefined`` (a name nobody passed is an error, never an empty string), and every ``{{ expression }}``
*serialised* by ``finalize`` into a YAML flow scalar or collection, so a quote, a newline, ``{{ }}``,
``&anchor`` or ``*alias`` inside a value stays inside it: a template computes whole values
(``{{ "nvidia-" ~ name }}``), never splices text into one. HTML pages autoescape instead
(:func:`html_environment`).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2

__all__ = ["html_environment", "template_dir", "yaml_environment", "yaml_value"]

# Characters a YAML 1.1 parser (PyYAML) reads as a line break or refuses outright inside a quoted scalar;
# JSON leaves them raw. Escaping them keeps the value byte-for-byte what was passed.
_YAML_UNSAFE = re.compile("[\u0085\u2028\u2029\u007f-\u009f\ud800-\udfff\ufeff\ufffe\uffff]")


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def _float(value: float) -> str:
    """A float as YAML 1.1 reads it back: PyYAML's float needs a dot, so ``1e+16`` is written ``1.0e+16``."""
    text = json.dumps(value, allow_nan=False)
    mantissa, e, exponent = text.partition("e")
    if e and "." not in mantissa:
        return f"{mantissa}.0e{exponent}"
    return text


def _flow(value: Any) -> str:
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_flow(str(k))}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def yaml_value(value: Any) -> str:
    """``value`` as YAML flow text that parses back to exactly ``value`` (str, number, bool, None, list, dict).

    Raises ``ValueError`` for NaN or infinity (no manifest field takes one) and ``TypeError`` for anything
    that is not plain data.
    """
    if isinstance(value, jinja2.runtime.Undefined):  # pragma: no cover - StrictUndefined raises first
        raise jinja2.UndefinedError("undefined value")
    return _YAML_UNSAFE.sub(_escape, _flow(value))


def template_dir() -> Path:
    """Where ``templates/`` is: ``gpucert/templates``, a link to the checkout's top-level folder, or the
    installed package data."""
    return Path(__file__).parent / "templates"


@functools.cache
def yaml_environment() -> jinja2.Environment:
    """The environment for manifests: strict, and every expression serialised (see the module docstring)."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(template_dir()),
        undefined=jinja2.StrictUndefined,
        finalize=yaml_value,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


@functools.cache
def html_environment() -> jinja2.Environment:
    """The environment for HTML pages: strict and autoescaped."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(template_dir()),
        undefined=jinja2.StrictUndefined,
        autoescape=True,
        keep_trailing_newline=True,
    )
