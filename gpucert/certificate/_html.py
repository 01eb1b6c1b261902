"""The certificate as a readable, self-contained HTML page (``templates/certificate.html.j2``)."""

from __future__ import annotations

from .._templates import html_environment
from ..report import VERDICT_COLOURS
from ._model import Certificate

__all__ = ["TEMPLATE", "render_certificate_html"]

TEMPLATE = "certificate.html.j2"
_CARDS = (
    ("certified", "#2e7d32"),
    ("degraded", VERDICT_COLOURS["warn"]),
    ("failed", VERDICT_COLOURS["fail"]),
    ("inconclusive", VERDICT_COLOURS["inconclusive"]),
)


def render_certificate_html(cert: Certificate, *, json_name: str = "certificate.json") -> str:
    """The page of ``cert``: the summary, each run's decisions, figures, findings, GPUs and file hashes, and
    the signature's status. ``json_name`` is the JSON file the page tells the reader to verify. Every value
    is escaped by the template's autoescape. Raises ``jinja2.TemplateError`` when the template is broken."""
    body = cert.body
    cluster = body.get("cluster")
    title = f"gpucert acceptance certificate — {cluster}" if cluster else "gpucert acceptance certificate"
    gpus = sum(int(n.get("gpus") or 0) for n in body.get("nodes") or [])
    return (
        html_environment()
        .get_template(TEMPLATE)
        .render(
            title=title,
            body=body,
            signature=cert.signature,
            cert_sha256=cert.sha256,
            json_name=json_name,
            cards=_CARDS,
            colours=VERDICT_COLOURS,
            gpus=gpus,
        )
    )
