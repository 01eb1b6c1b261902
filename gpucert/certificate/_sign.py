"""Ed25519 signing of certificates (``cryptography``), with keys as PEM files: the private key PKCS#8,
unencrypted (as ``openssl genpkey -algorithm ed25519`` or ``gpucert certificate keygen`` writes it), the public
key SubjectPublicKeyInfo. Checked without a trusted key, a signature proves only that nobody changed the
certificate since whoever holds that key signed it; checked against ``--public-key`` it proves who signed.
"""

from __future__ import annotations

import base64
import binascii
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .._io import check_out_folder, make_out_folder
from ..errors import InputError
from ._canonical import sha256_hex
from ._model import ALGORITHM, Certificate, Signature

__all__ = ["check_signature", "generate_keys", "load_private_key", "load_public_key", "sign"]

PRIVATE_KEY_NAME = "gpucert-signing.pem"
PUBLIC_KEY_NAME = "gpucert-signing.pub.pem"


def _raw(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_fingerprint(public: Ed25519PublicKey) -> str:
    """SHA-256 of the raw 32-byte public key, hex."""
    return sha256_hex(_raw(public))


def _read(path: str | Path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    """The Ed25519 private key in the PEM file ``path``; raises :class:`InputError` naming the file when it
    cannot be read, is encrypted, or is not an Ed25519 private key in PEM."""
    data = _read(path, "private key")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise InputError(f"{path}: the private key is encrypted; give an unencrypted PKCS#8 PEM key") from None
    except (ValueError, UnsupportedAlgorithm):
        raise InputError(f"{path}: not a PEM private key (expected -----BEGIN PRIVATE KEY-----, Ed25519)") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise InputError(f"{path}: a {type(key).__name__.removeprefix('_')} key, not an Ed25519 private key")
    return key


def load_public_key(path: str | Path) -> Ed25519PublicKey:
    """The Ed25519 public key in the PEM file ``path``; raises :class:`InputError` naming the file when it
    cannot be read or is not an Ed25519 public key in PEM (a private key is refused: give its public half)."""
    data = _read(path, "public key")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm):
        raise InputError(
            f"{path}: not a PEM public key (expected -----BEGIN PUBLIC KEY-----, Ed25519; "
            "`gpucert certificate keygen` writes one)"
        ) from None
    if not isinstance(key, Ed25519PublicKey):
        raise InputError(f"{path}: a {type(key).__name__.removeprefix('_')} key, not an Ed25519 public key")
    return key


def sign(cert: Certificate, private_key: Ed25519PrivateKey) -> Certificate:
    """``cert`` signed with ``private_key`` (any earlier signature replaced)."""
    public = private_key.public_key()
    value = private_key.sign(cert.canonical())
    signature = Signature(
        algorithm=ALGORITHM,
        public_key=base64.b64encode(_raw(public)).decode(),
        key_sha256=key_fingerprint(public),
        value=base64.b64encode(value).decode(),
    )
    return Certificate(cert.body, signature)


def check_signature(cert: Certificate, public_key: Ed25519PublicKey | None) -> tuple[bool, str]:
    """(holds, in words) for ``cert``'s signature: checked against ``public_key`` when given (a
    certificate without a signature then fails), else against the key embedded with it (an unsigned
    certificate then holds: there is no signature to break)."""
    signature = cert.signature
    if signature is None:
        if public_key is not None:
            return False, f"the certificate is not signed; key {key_fingerprint(public_key)[:16]} was expected"
        return True, "unsigned (nothing to check; sign with --key to make changes to it detectable)"
    try:
        embedded = Ed25519PublicKey.from_public_bytes(base64.b64decode(signature.public_key, validate=True))
        value = base64.b64decode(signature.value, validate=True)
    except (ValueError, binascii.Error):
        return False, "the embedded signature or public key is not valid base64 of an Ed25519 key"
    key = public_key or embedded
    fingerprint = key_fingerprint(key)
    if public_key is not None and key_fingerprint(embedded) != fingerprint:
        return False, f"signed by key {key_fingerprint(embedded)[:16]}, not by the given key {fingerprint[:16]}"
    try:
        key.verify(value, cert.canonical())
    except InvalidSignature:
        return False, f"the signature does not match the certificate's content (key {fingerprint[:16]}): it was changed"
    if signature.key_sha256 != fingerprint:
        return False, f"the signature names key {signature.key_sha256[:16]} but was made by {fingerprint[:16]}"
    if public_key is None:
        return True, f"valid, by the embedded key {fingerprint[:16]} (give --public-key to check who signed)"
    return True, f"valid, by the given key {fingerprint[:16]}"


def generate_keys(folder: str | Path) -> tuple[Path, Path]:
    """Write a new Ed25519 key pair into ``folder`` (the private key readable by its owner only); returns
    (private, public) paths. A missing ``folder`` is made (readable by its owner only, as ``~/.ssh``), with
    its parents. Raises :class:`InputError` when it cannot be made or is not a folder, or a key file is
    already there (never overwritten)."""
    where = Path(folder).expanduser()  # "--out=~/.gpucert": no shell expands a tilde after "="
    check_out_folder(where, f"--out {folder}")
    private_path, public_path = where / PRIVATE_KEY_NAME, where / PUBLIC_KEY_NAME
    for path in (private_path, public_path):
        if path.exists():
            raise InputError(f"{path}: exists; keys are never overwritten (move it away or choose another --out)")
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    make_out_folder(where, f"--out {folder}", mode=0o700)
    try:
        fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(private)
        public_path.write_bytes(public)
    except OSError as exc:
        raise InputError(f"--out {folder}: cannot write the keys ({exc.strerror or exc})") from None
    return private_path, public_path
