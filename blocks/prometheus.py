"""The ``Prometheus`` block: where operate reads DCGM telemetry from, with its credentials and TLS checks."""

from __future__ import annotations

from typing import Literal

from prefect.blocks.core import Block
from pydantic import ConfigDict, Field, SecretStr, model_validator

from gpucert.blocks._schema import block_schema_extra
from gpucert.errors import InputError
from gpucert.telemetry import PrometheusSource

__all__ = ["Prometheus"]


class Prometheus(Block):
    """A Prometheus server that scrapes the DCGM exporters: operate reads each night's telemetry from it.

    A secured server takes a bearer ``token``, or a ``username`` and ``password`` (basic auth), and any
    extra ``headers`` (a Mimir, Cortex or Thanos tenant's ``X-Scope-OrgID``). Over https the certificate
    is checked against the system's CAs, or against ``ca_file`` for a private CA; ``verify_tls`` off
    checks nothing. The token, the password and the header values are secrets: never shown, never
    logged.

    Example:
        ```python
        from datetime import UTC, datetime, timedelta
        from gpucert.blocks.prometheus import Prometheus
        prometheus = Prometheus.load("BLOCK_NAME")
        day = prometheus.source().read(datetime.now(UTC) - timedelta(days=1), run_id="telemetry-1")
        print(day.problems)
        ```
    """

    _block_type_name = "gpucert Prometheus"
    _block_type_slug = "gpucert-prometheus"
    _documentation_url = "https://github.com/gpucert/gpucert#readme"  # type: ignore[assignment]
    _description = (
        "The Prometheus gpucert reads DCGM telemetry from between certifications: its URL, credentials and TLS checks."
    )

    # A validation error would otherwise echo its input, a token or password given as a plain string too.
    model_config = ConfigDict(hide_input_in_errors=True, json_schema_extra=block_schema_extra)

    url: str = Field(
        description="The server's base URL, e.g. https://prometheus.monitoring:9090 (a path prefix is kept)."
    )
    token: SecretStr | None = Field(
        default=None, description="A bearer token, sent as Authorization: Bearer; empty for none."
    )
    username: str | None = Field(default=None, description="Basic auth: the user; needs a password.")
    password: SecretStr | None = Field(default=None, description="Basic auth: the password.")
    headers: dict[str, SecretStr] = Field(
        default_factory=dict,
        description="Extra request headers, e.g. X-Scope-OrgID for a tenant; their values are secret.",
    )
    verify_tls: bool = Field(
        default=True, description="Check the server's TLS certificate; off, nothing is checked (ca_file too)."
    )
    ca_file: str | None = Field(
        default=None,
        description="A CA file (PEM) or directory to check the certificate against, on the worker; empty "
        "for the system's CAs.",
    )
    timeout_s: float = Field(
        default=60.0, gt=0, description="Seconds per request, also Prometheus' timeout for each query."
    )
    host_label: Literal["hostname", "Hostname"] | None = Field(
        default=None,
        description="The DCGM exporter's host label to read (hostname since dcgm-exporter#655, Hostname "
        "before); empty to read whichever each series carries.",
    )

    @model_validator(mode="after")
    def _complete(self) -> Prometheus:
        # After validation, so that a message can never echo a raw secret from the input.
        if (self.username is None) != (self.password is None):
            raise ValueError("basic auth needs both a username and a password")
        if self.token is not None and self.username is not None:
            raise ValueError("give a bearer token or a username and password, not both")
        if self.token is not None and any(name.lower() == "authorization" for name in self.headers):
            raise ValueError("give a bearer token or an Authorization header, not both")
        try:
            # The core's own checks (the URL, header names and values, Authorization twice), without the
            # CA file: it need only exist on the worker that reads.
            self._source(verify=self.verify_tls)
        except InputError as exc:
            raise ValueError(str(exc)) from None
        return self

    def source(self) -> PrometheusSource:
        """The source operate reads with (see :class:`gpucert.telemetry.PrometheusSource`); raises
        ``gpucert.errors.InputError`` when ``ca_file`` cannot be read here."""
        return self._source(verify=(self.ca_file or True) if self.verify_tls else False)

    def _source(self, *, verify: bool | str) -> PrometheusSource:
        headers: dict[str, SecretStr | str] = dict(self.headers)
        if self.token is not None:
            headers["Authorization"] = SecretStr(f"Bearer {self.token.get_secret_value()}")
        basic = (self.username, self.password) if self.username and self.password else None
        return PrometheusSource(
            self.url, self.host_label, headers=headers, basic_auth=basic, verify=verify, timeout_s=self.timeout_s
        )
