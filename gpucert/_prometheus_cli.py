"""``--prometheus`` on the command line (``operate``, ``explain``): a URL with its credentials and TLS checks
(the options' help says which), or the name of a saved ``gpucert-prometheus`` block (its own stand).

Secrets come from files or the environment, never from the command line (``ps`` shows it to every user).
Nothing here imports Prefect until a block is named or made.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import InputError

__all__ = [
    "PASSWORD_ENV",
    "TOKEN_ENV",
    "PrometheusOptions",
    "add_prometheus_arguments",
    "prometheus_block",
    "prometheus_options",
]

TOKEN_ENV = "GPUCERT_PROMETHEUS_TOKEN"
PASSWORD_ENV = "GPUCERT_PROMETHEUS_PASSWORD"


@dataclass(frozen=True)
class PrometheusOptions:
    """What ``--prometheus`` and its companions said (see the module docstring); holds no secret, only where
    the secrets are."""

    target: str
    token_file: str | None = None
    user: str | None = None
    password_file: str | None = None
    headers: tuple[str, ...] = ()
    ca_file: str | None = None
    insecure: bool = False

    @property
    def is_url(self) -> bool:
        """Whether ``target`` is a URL (else a saved block's name)."""
        return "://" in self.target

    @property
    def has_auth(self) -> bool:
        return bool(self.token_file or self.user or self.password_file or self.headers or self.ca_file or self.insecure)


def add_prometheus_arguments(parser: argparse.ArgumentParser, *, required: bool, what: str) -> None:
    """The ``--prometheus`` options (see the module docstring) on ``parser``; ``what`` ends its help."""
    parser.add_argument(
        "--prometheus",
        required=required,
        metavar="URL|BLOCK",
        help=f"the Prometheus URL, or the name of a saved gpucert-prometheus block: {what}",
    )
    parser.add_argument(
        "--prometheus-token-file",
        metavar="PATH",
        help=f"a bearer token for --prometheus, read from this file (or ${TOKEN_ENV})",
    )
    parser.add_argument("--prometheus-user", metavar="USER", help="basic auth for --prometheus: the user")
    parser.add_argument(
        "--prometheus-password-file",
        metavar="PATH",
        help=f"basic auth for --prometheus: the password, read from this file (or ${PASSWORD_ENV})",
    )
    parser.add_argument(
        "--prometheus-header",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="an extra header for --prometheus, e.g. 'X-Scope-OrgID: team-a' (repeatable)",
    )
    parser.add_argument(
        "--prometheus-ca-file", metavar="PATH", help="check --prometheus's TLS certificate against this CA file (PEM)"
    )
    parser.add_argument(
        "--prometheus-insecure", action="store_true", help="do not check --prometheus's TLS certificate at all"
    )


def prometheus_options(args: argparse.Namespace) -> PrometheusOptions | None:
    """The options parsed by :func:`add_prometheus_arguments`; None without ``--prometheus``. Raises
    :class:`InputError` for companions without ``--prometheus``."""
    options = PrometheusOptions(
        target=args.prometheus or "",
        token_file=args.prometheus_token_file,
        user=args.prometheus_user,
        password_file=args.prometheus_password_file,
        headers=tuple(args.prometheus_header or ()),
        ca_file=args.prometheus_ca_file,
        insecure=bool(args.prometheus_insecure),
    )
    if not args.prometheus:
        if options.has_auth:
            raise InputError("the --prometheus-* options need --prometheus")
        return None
    return options


def _secret_from(path: str | None, env: str, what: str) -> str | None:
    if path:
        try:
            text = Path(path).expanduser().read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise InputError(f"--prometheus-{what}-file {path}: cannot be read ({exc.strerror or exc})") from None
        if not text:
            raise InputError(f"--prometheus-{what}-file {path}: the file is empty")
        return text
    value = os.environ.get(env, "").strip()
    return value or None


def _headers(raw: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in raw:
        name, sep, value = item.partition(":")
        if not sep:
            name, sep, value = item.partition("=")
        if not sep or not name.strip():
            shown = name.strip() or repr(item)
            raise InputError(f"--prometheus-header {shown}: write 'NAME: VALUE'")
        out[name.strip()] = value.strip()
    return out


def block_fields(options: PrometheusOptions) -> dict[str, Any]:
    """The fields of a ``Prometheus`` block for a URL and its companions (secrets read from their files or
    the environment). Raises :class:`InputError` naming the option that is wrong."""
    token = _secret_from(options.token_file, TOKEN_ENV, "token")
    password = (
        _secret_from(options.password_file, PASSWORD_ENV, "password")
        if (options.user or options.password_file)
        else None
    )
    if options.user and password is None:
        raise InputError(f"--prometheus-user needs a password: --prometheus-password-file or ${PASSWORD_ENV}")
    if password is not None and not options.user:
        raise InputError("--prometheus-password-file needs --prometheus-user")
    if token is not None and options.user:
        raise InputError("give --prometheus a bearer token or a user and password, not both")
    if options.insecure and options.ca_file:
        raise InputError("give --prometheus-ca-file or --prometheus-insecure, not both")
    if options.ca_file and not Path(options.ca_file).expanduser().exists():
        raise InputError(f"--prometheus-ca-file {options.ca_file}: no such file")
    fields: dict[str, Any] = {
        "url": options.target,
        "headers": _headers(options.headers),
        "verify_tls": not options.insecure,
    }
    if token is not None:
        fields["token"] = token
    if options.user:
        fields["username"], fields["password"] = options.user, password
    if options.ca_file:
        fields["ca_file"] = str(Path(options.ca_file).expanduser())
    return fields


def prometheus_block(options: PrometheusOptions) -> Any:
    """The ``blocks.prometheus.Prometheus`` block ``options`` name or describe. A block's name loads the saved
    block (auth options then are refused: the block's own stand). Raises :class:`InputError` for bad options, a
    block that does not exist or cannot be loaded."""
    from gpucert.blocks.prometheus import Prometheus

    if not options.is_url:
        if options.has_auth:
            raise InputError(
                f"--prometheus {options.target} names a saved block: its credentials and CA are the "
                "block's; give the --prometheus-* options with a URL"
            )
        try:
            return Prometheus.load(options.target)
        except (ValueError, RuntimeError) as exc:
            raise InputError(
                f"--prometheus {options.target}: no saved gpucert-prometheus block of that name "
                f"could be loaded ({str(exc).splitlines()[0][:200]})"
            ) from None
    try:
        return Prometheus(**block_fields(options))
    except ValueError as exc:
        # pydantic hides the input (hide_input_in_errors): its message holds no secret.
        errors = exc.errors() if hasattr(exc, "errors") else []
        detail = str(errors[0].get("msg", exc)) if errors else str(exc).splitlines()[0]
        raise InputError(f"--prometheus: {detail.removeprefix('Value error, ')}") from None
