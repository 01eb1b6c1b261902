"""Reaching a cluster: a kubeconfig file, a kubeconfig as data, or the pod's service account.

The order is the one ``kubectl`` follows: an explicit kubeconfig, then ``$KUBECONFIG`` /
``~/.kube/config``, then the in-cluster service account (a worker running in the cluster). A
kubeconfig that cannot be read, has no such context or names a server URL that cannot be one (a port
out of range) is an :class:`InputError` naming it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .._yaml import read_yaml_mapping
from ..errors import InputError
from ._client import Kube
from ._retry import RetryPolicy

__all__ = ["connect", "kubeconfig_file"]


def connect(
    kubeconfig: str | os.PathLike[str] | None = None,
    *,
    context: str | None = None,
    config_dict: Mapping[str, Any] | None = None,
    retry: RetryPolicy | None = None,
) -> Kube:
    """A :class:`Kube` for the cluster described; raises :class:`InputError` when it cannot be set up."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    configuration = client.Configuration()
    try:
        if config_dict is not None:
            config.load_kube_config_from_dict(  # type: ignore[no-untyped-call]
                dict(config_dict), context=context, client_configuration=configuration
            )
        elif kubeconfig is not None or _default_kubeconfig() is not None:
            path = Path(kubeconfig) if kubeconfig is not None else _default_kubeconfig()
            if path is None or not path.is_file():
                raise InputError(f"kubeconfig {path}: no such file")
            # UTF-8 YAML holding a mapping: the client's loader fails on anything else with a bare parser error.
            read_yaml_mapping(path, f"kubeconfig {path}", what="a kubeconfig (a mapping)")
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=str(path), context=context, client_configuration=configuration
            )
        else:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except (ConfigException, ValueError, TypeError, KeyError, AttributeError) as exc:
        # The client's loader reads fields without checking their types: a wrong one is a bare error.
        typed = isinstance(exc, TypeError | KeyError | AttributeError)
        what = "a field has the wrong type or is missing: " if typed else ""
        raise InputError(f"{_source(kubeconfig, config_dict)}: {what}{str(exc) or type(exc).__name__}") from None
    source = _source(kubeconfig, config_dict)
    _check_server(str(configuration.host or ""), source)
    _check_credentials(configuration.api_key, source)
    # Retries are the RetryPolicy's, within the call's deadline: urllib3's own would retry each read three
    # times, at the full timeout each.
    configuration.retries = False
    return Kube(client.ApiClient(configuration), retry=retry)


def _source(kubeconfig: str | os.PathLike[str] | None, config_dict: Mapping[str, Any] | None) -> str:
    if config_dict is not None:
        return "the kubeconfig given as data"
    path = kubeconfig if kubeconfig is not None else _default_kubeconfig()
    return f"kubeconfig {path}" if path is not None else "the in-cluster service account"


def _check_server(host: str, source: str) -> None:
    """Raise :class:`InputError` naming ``source`` when the server URL cannot be connected to as written
    (a port out of range, a port that is not a number): urllib3 would fail each request with a parse error
    that reads like a network failure."""
    try:
        parts = urlsplit(host)
        parts.port  # noqa: B018 - parsing the port is what raises
    except ValueError as exc:
        raise InputError(f"{source}: the cluster's server {host!r} (clusters[].cluster.server): {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in host):
        raise InputError(f"{source}: the cluster's server {host!r} (clusters[].cluster.server) is not an http(s) URL")


def _check_credentials(api_key: Mapping[str, Any], source: str) -> None:
    """Raise :class:`InputError` naming ``source`` when a credential (a bearer token) holds a character an
    HTTP header cannot carry: a line break would end the header (http.client refuses it, with the token in
    its message). The credential itself is never shown."""
    for value in api_key.values():
        if isinstance(value, str) and any(not " " <= c <= "~" for c in value):
            raise InputError(
                f"{source}: the user's token (users[].user.token) holds a line break, a control character or a "
                "character outside ASCII, which no HTTP header carries"
            )


def kubeconfig_file(given: str | os.PathLike[str] | None, *, option: str = "--kubeconfig") -> Path:
    """The kubeconfig file a command reads, in ``kubectl``'s order: ``given``, else the first file of
    ``$KUBECONFIG``, else ``~/.kube/config``. For the commands that need a file (the simulator's, which has
    no in-cluster account); raises :class:`InputError` naming ``option`` when there is none."""
    path = Path(given).expanduser() if given is not None else _default_kubeconfig()
    if path is None:
        raise InputError(f"no kubeconfig: give {option} PATH or set $KUBECONFIG (~/.kube/config does not exist)")
    return path


def _default_kubeconfig() -> Path | None:
    env = os.environ.get("KUBECONFIG")
    if env:
        return Path(env.split(os.pathsep)[0]).expanduser()
    home = Path("~/.kube/config").expanduser()
    return home if home.is_file() else None
