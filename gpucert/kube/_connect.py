"""Reaching a cluster: a kubeconfig file, a kubeconfig as data, or the pod's service account.

The order is the one ``kubectl`` follows: an explicit kubeconfig, then ``$KUBECONFIG`` /
``~/.kube/config``, then the in-cluster service account (a worker running in the cluster). A
kubeconfig that cannot be read or has no such context is an :class:`InputError` naming it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import InputError
from ._client import Kube
from ._retry import RetryPolicy

__all__ = ["connect"]


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
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=str(path), context=context, client_configuration=configuration
            )
        else:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except ConfigException as exc:
        source = (
            "the kubeconfig given as data" if config_dict is not None else f"kubeconfig {kubeconfig or ''}"
        )
        raise InputError(f"{source.strip()}: {exc}") from exc
    return Kube(client.ApiClient(configuration), retry=retry)


def _default_kubeconfig() -> Path | None:
    env = os.environ.get("KUBECONFIG")
    if env:
        return Path(env.split(os.pathsep)[0]).expanduser()
    home = Path("~/.kube/config").expanduser()
    return home if home.is_file() else None
