"""Acceptance certificates: what a certification run proved about a cluster, in a form anyone can check.

A certificate (:class:`Certificate`, schema ``gpucert.certificate/2``; ``/1`` is still verified) is one
JSON object, made from the store alone by :func:`build_certificate`:

* ``schema``, ``gpucert`` (the version that built it), ``issued_at``, ``cluster`` (a name, when given),
  ``store`` (the root URI), ``scope`` (``{"run": id}`` or ``{"since": day}``);
* ``runs``: per run — ``run_id``, ``date``, ``folder``, the confirming ``reruns``, when it was
  ``measured`` and ``decided_at``, the ``baseline`` version it was judged against, the ``policy`` in
  force (the record of ``policy.json`` and its ``sha256``, the fingerprint of thresholds and spec floors),
  the ``stack`` versions (common to every node, and each node's record), a ``tally`` of decisions, every
  node with its GPUs (index, UUID, model, serial and VBIOS where the payload recorded them), its settled
  ``decision`` (state, verdict, cause, hard gate, confirmed, taint, the runs it rests on, summary), its
  ``figures`` (per metric the worst GPU's median against its reference and the spec floor) and its
  ``findings`` (the verdict rows that are not a pass, re-runs' included); the ``fleet_findings``; and
  ``files``: the key, SHA-256 and size of every object of the run's folder and of the baseline version;
* ``skipped`` (runs of a ``since`` scope that could not be certified, with why), ``nodes`` (each node's
  standing: its latest decision over the runs) and ``tally``;
* ``signature`` (optional, beside the body): Ed25519 over the body's RFC 8785 canonical JSON
  (:mod:`._canonical`), with the public key and its fingerprint (:mod:`._sign`).

:func:`verify_certificate` checks the signature and, given the store, every file's hash, a re-judgement
of every decision from the stored results, baseline and policy (:mod:`._rejudge`), and that the
certificate's contents are what the stored files give (:mod:`._verify`). :func:`render_certificate_html`
writes the readable page. Nothing here imports Prefect.
"""

from ._build import build_certificate, policy_sha256, run_section
from ._canonical import canonical_bytes, sha256_hex
from ._files import RunFiles
from ._html import render_certificate_html
from ._model import SCHEMA, Certificate, Signature, read_certificate
from ._rejudge import Difference, rejudge
from ._sign import (
    PRIVATE_KEY_NAME,
    PUBLIC_KEY_NAME,
    check_signature,
    generate_keys,
    key_fingerprint,
    load_private_key,
    load_public_key,
    sign,
)
from ._verify import Check, VerifyReport, verify_certificate

__all__ = [
    "PRIVATE_KEY_NAME",
    "PUBLIC_KEY_NAME",
    "SCHEMA",
    "Certificate",
    "Check",
    "Difference",
    "RunFiles",
    "Signature",
    "VerifyReport",
    "build_certificate",
    "canonical_bytes",
    "check_signature",
    "generate_keys",
    "key_fingerprint",
    "load_private_key",
    "load_public_key",
    "policy_sha256",
    "read_certificate",
    "rejudge",
    "render_certificate_html",
    "run_section",
    "sha256_hex",
    "sign",
    "verify_certificate",
]
