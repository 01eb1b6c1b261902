"""Acceptance certificates: what a certification run proved about a cluster, in a form anyone can check
(docs/design/certificate-and-audit.md).

A certificate (:class:`Certificate`, schema ``gpucert.certificate/2``; ``/1`` is still verified) is one JSON object
made from the store alone by :func:`build_certificate`: per run, every node with its GPUs, its settled decision,
the figures behind it and its findings, the baseline version, the policy and the stack in force, and the SHA-256
of every stored file it rests on; then each node's standing and a tally. It may carry an Ed25519 ``signature``
over the body's RFC 8785 canonical JSON (:mod:`._canonical`, :mod:`._sign`).

:func:`verify_certificate` checks the signature and, given the store, every file's hash, a replay of every
decision from the stored results, baseline and policy (:mod:`._replay`), and that the certificate's contents are
what the stored files give. :func:`render_certificate_html` writes the readable page. Nothing here imports Prefect.
"""

from ._build import build_certificate
from ._html import render_certificate_html
from ._model import SCHEMA, Certificate, Signature, read_certificate
from ._sign import check_signature, generate_keys, load_private_key, load_public_key, sign
from ._verify import Check, VerifyReport, verify_certificate

__all__ = [
    "SCHEMA",
    "Certificate",
    "Check",
    "Signature",
    "VerifyReport",
    "build_certificate",
    "check_signature",
    "generate_keys",
    "load_private_key",
    "load_public_key",
    "read_certificate",
    "render_certificate_html",
    "sign",
    "verify_certificate",
]
