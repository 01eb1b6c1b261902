"""Kubernetes name rules, written once: every layer that checks a run id, a namespace, a label value or a
label prefix asks here. A run id is a DNS label because it also labels the run's Jobs and names its store
folder: a mistyped one is an :class:`~gpucert.errors.InputError` naming the rule, never a failure half-way.
"""

from __future__ import annotations

import re
from typing import Final

from .errors import InputError, RunIdError

__all__ = [
    "DNS_LABEL",
    "RUN_ID_RULE",
    "RunIdError",
    "check_label_selector",
    "check_run_id",
    "dns_label_ok",
    "dns_subdomain_ok",
    "label_value_ok",
]

#: A DNS label (RFC 1123): what ``fullmatch`` accepts is a namespace, a Job name or a run id.
DNS_LABEL: Final = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN: Final = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE: Final = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?")

#: The rule in words, for messages.
RUN_ID_RULE: Final = (
    "a run id is a DNS label: at most 63 characters of a-z, 0-9 and '-', starting and ending with a letter or digit"
)


def dns_label_ok(value: object) -> bool:
    """Whether ``value`` is a DNS label (≤ 63 characters of ``a-z0-9-``): a namespace, a run id, a Job name."""
    return isinstance(value, str) and DNS_LABEL.fullmatch(value) is not None


def dns_subdomain_ok(value: object) -> bool:
    """Whether ``value`` is a DNS subdomain (≤ 253 characters): most object names, a label prefix."""
    return isinstance(value, str) and len(value) <= 253 and _DNS_SUBDOMAIN.fullmatch(value) is not None


def label_value_ok(value: object) -> bool:
    """Whether ``value`` may be a label value (≤ 63 characters of ``A-Za-z0-9-_.``, alphanumeric ends)."""
    return isinstance(value, str) and len(value) <= 63 and _LABEL_VALUE.fullmatch(value) is not None


def check_run_id(run_id: object, *, what: str = "run id") -> str:
    """``run_id`` when it is a valid run id; raises :class:`RunIdError` naming it and the rule."""
    if not dns_label_ok(run_id):
        raise RunIdError(f"{what} {run_id!r} is not valid: {RUN_ID_RULE}")
    assert isinstance(run_id, str)
    return run_id


_KEY: Final = re.compile(
    r"(?:[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)
_VALUE: Final = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?"
_REQUIREMENT: Final = re.compile(
    rf"\s*(?:!\s*(?P<absent>{_KEY.pattern})|(?P<key>{_KEY.pattern})\s*"
    rf"(?:(?:==|!=|=)\s*{_VALUE}|\s(?:in|notin)\s*\(\s*{_VALUE}(?:\s*,\s*{_VALUE})*\s*\))?)\s*"
)


def check_label_selector(selector: str) -> str:
    """``selector`` when it is a Kubernetes label selector (``a=b,c!=d,e in (f,g),!h``); raises
    :class:`InputError` naming the requirement that is not, before any server would answer 400."""
    depth, start, parts = 0, 0, []
    for i, char in enumerate(selector):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(selector[start:i])
            start = i + 1
    parts.append(selector[start:])
    for part in parts:
        if not _REQUIREMENT.fullmatch(part):
            raise InputError(
                f"label selector {selector!r}: {part.strip()!r} is not a requirement "
                "(key, !key, key=value, key!=value, key in (a,b), key notin (a,b))"
            )
    return selector
