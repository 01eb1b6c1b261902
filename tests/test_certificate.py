"""``gpucert certificate``: an acceptance certificate of a real certify run (the flow on ``gpucert sim``, under
the session's Prefect server), verified against its store — and made to fail by a changed results value, a
re-written decision whose certificate was re-made to match, a changed byte of a signed certificate, the
wrong public key; bad input is one line and exit 2. The S3 store (moto's server) serves the same run. The
signed bytes are RFC 8785: a verifier with a JCS library and Ed25519, and no gpucert, checks a certificate;
one of the legacy schema (/1, Python's canonical JSON) still verifies as it was signed."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import rfc8785
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from gpucert.blocks.cluster import GpuCluster
from gpucert.blocks.store import StoreLocation
from gpucert.certificate import (
    SCHEMA,
    Certificate,
    build_certificate,
    check_signature,
    read_certificate,
    render_certificate_html,
    sign,
    verify_certificate,
)
from gpucert.cli import main
from gpucert.flows.certify import certify
from gpucert.store import BaselineStore, S3ObjectStore, open_store
from gpucert_sim import SimCluster
from gpucert_sim.fleet import Fault

from .s3servers import ACCESS_KEY, REGION, SECRET_KEY, moto_server, s3_client

NIGHT = "cert-night"
FOLDER_GLOB = f"runs/date=*/run={NIGHT}"


@dataclass(frozen=True)
class Certified:
    """A store holding a clean certify run (it seeds the baseline) and a night with two faults: a PCIe link
    at Gen4 (a fail a re-run confirms) and a row-remap failure (a hard gate)."""

    store: Path
    pcie: str
    remap: str
    seed_version: str

    def copy(self, where: Path) -> Path:
        shutil.copytree(self.store, where)
        return where

    @staticmethod
    def folder(store: Path) -> Path:
        [folder] = store.glob(FOLDER_GLOB)
        return folder


@pytest.fixture(scope="module")
def certified(prefect_harness: None, tmp_path_factory: pytest.TempPathFactory) -> Certified:
    del prefect_harness
    root = tmp_path_factory.mktemp("certificate") / "store"
    with SimCluster(nodes=6, preconfigured=True, seed=6) as sim:
        cluster, block = GpuCluster(kubeconfig=str(sim.kubeconfig_path)), StoreLocation(uri=root.as_uri())
        # Fixed run ids make the simulated measurements, and so these tests, repeatable.
        seed = asyncio.run(certify(cluster=cluster, store=block, run_id="cert-seed"))
        names = sim.fleet.node_names
        sim.inject_fault(Fault("pcie_gen4", names[1], 2))
        sim.inject_fault(Fault("remap_failure", names[3], 5))
        night = asyncio.run(certify(cluster=cluster, store=block, run_id=NIGHT))
    assert seed.baseline_version is not None
    assert night.reruns == [f"{NIGHT}-c1"]  # the PCIe fail was confirmed by a re-run
    return Certified(root, names[1], names[3], seed.baseline_version)


def _build(store: Path, out: Path, *extra: str) -> Path:
    out.mkdir(exist_ok=True)
    assert main(["certificate", "--store", store.as_uri(), "--run", NIGHT, "--out", str(out), *extra]) == 0
    return out / f"certificate-{NIGHT}.json"


def _verify(cert: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, list[str]]:
    capsys.readouterr()
    code = main(["certificate", "verify", str(cert), *extra])
    return code, capsys.readouterr().out.splitlines()


def test_the_certificate_of_a_certify_run_verifies_and_says_what_was_decided(
    certified: Certified, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _build(certified.store, tmp_path, "--cluster", "lab <b>A</b>")
    code, lines = _verify(path, capsys, "--store", certified.store.as_uri())
    assert code == 0, lines
    assert lines[-1] == "the certificate verifies"
    assert any(line.startswith(f"ok    re-judgement of {NIGHT}") for line in lines)

    body = json.loads(path.read_text())
    assert body["schema"] == "gpucert.certificate/2"
    [run] = body["runs"]
    assert run["reruns"] == [f"{NIGHT}-c1"]
    assert run["baseline"]["version"] == certified.seed_version  # judged against what the clean run left
    assert run["policy"]["record"]["baseline_version"] == certified.seed_version
    assert run["stack"]["common"]["driver"]
    nodes = {n["node"]: n for n in run["nodes"]}
    assert len(nodes) == 6
    pcie = nodes[certified.pcie]
    assert (pcie["decision"]["state"], pcie["decision"]["cause"]) == ("failed", "pcie")
    assert pcie["decision"]["runs"] == [NIGHT, f"{NIGHT}-c1"]
    assert nodes[certified.remap]["decision"]["hard_gate"] is True
    assert run["tally"] == {"certified": 4, "failed": 2}
    # The GPUs and the figures behind each decision: the Gen4 link halves the GPU's host copies, under the floor.
    assert len({g["uuid"] for g in pcie["gpus"]}) == 8
    h2d = next(f for f in pcie["figures"] if f["metric"] == "h2d_gbps")
    assert h2d["gpu"] == 2
    assert h2d["reference_kind"] == "own"
    assert h2d["value"] < h2d["spec_floor"] < h2d["reference"]
    assert any(f["run_id"] == f"{NIGHT}-c1" for f in pcie["findings"])
    # Every file it rests on, with the hash of its bytes as stored.
    hashes = {f["key"]: f["sha256"] for f in run["files"]}
    names = {key.rsplit("/", 1)[-1] for key in hashes}
    assert {
        "results.parquet",
        "results-c1.parquet",
        "decisions.parquet",
        "policy.json",
        "stack.json",
        "verdicts-c1.parquet",
        "baseline.parquet",
        "meta.json",
    } <= names
    for key, digest in hashes.items():
        assert hashlib.sha256((certified.store / key).read_bytes()).hexdigest() == digest

    html = (tmp_path / f"certificate-{NIGHT}.html").read_text()
    assert html.startswith("<!DOCTYPE html>")
    assert "lab &lt;b&gt;A&lt;/b&gt;" in html  # escaped
    assert "<b>A</b>" not in html
    for fetches in ("<script", "src=", 'href="http', "url(", "@import"):  # self-contained: nothing fetched
        assert fetches not in html
    for shown in (certified.pcie, run["policy"]["sha256"], certified.seed_version, h2d["gpu_uuid"]):
        assert shown in html


def test_a_changed_value_in_the_results_fails_naming_the_file(
    certified: Certified, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _build(certified.store, tmp_path / "out")
    store = certified.copy(tmp_path / "store")
    results = Certified.folder(store) / "results.parquet"
    frame = pd.read_parquet(results)
    row = frame.index[frame["metric"] == "gemm_bf16_tflops"][0]
    frame.loc[row, "value"] *= 1.001
    frame.to_parquet(results, index=False)
    code, lines = _verify(path, capsys, "--store", store.as_uri())
    assert code == 3
    assert lines[-1].startswith("the certificate does NOT verify: files of cert-night:")
    assert lines[-1].endswith("/results.parquet: its content changed (sha256 differs from the certificate's)")


@pytest.mark.parametrize("table", ["decisions", "verdicts"])
def test_a_rewritten_decision_fails_the_re_judgement_even_with_its_hash_re_forged(
    certified: Certified, tmp_path: Path, table: str
) -> None:
    store = certified.copy(tmp_path / "store")
    path = Certified.folder(store) / f"{table}.parquet"
    frame = pd.read_parquet(path)
    mine = frame["node"] == certified.pcie
    if table == "decisions":
        frame.loc[mine, ["state", "verdict", "taint"]] = ["certified", "pass", "lifted"]
        frame.loc[mine, "cause"] = None
    else:
        frame.loc[mine, "verdict"] = "pass"
    frame.to_parquet(path, index=False)
    # The forger's best move: a fresh, unsigned certificate of the altered store, every hash and figure
    # matching it. Only the re-judgement from the stored results can tell.
    forged = build_certificate(open_store(store.as_uri()), NIGHT)
    report = verify_certificate(forged, open_store(store.as_uri()))
    failed = [c for c in report.checks if not c.ok]
    assert [c.name for c in failed] == [f"re-judgement of {NIGHT}"]
    assert f"node {certified.pcie}:" in failed[0].detail
    assert report.first_failure is failed[0]


def test_a_signed_certificate_fails_on_a_changed_byte_and_on_the_wrong_key(
    certified: Certified, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys, others = tmp_path / "keys", tmp_path / "others"
    for folder in (keys, others):
        folder.mkdir()
        assert main(["certificate", "keygen", "--out", str(folder)]) == 0
    assert (keys / "gpucert-signing.pem").stat().st_mode & 0o077 == 0  # the private key is the owner's only
    path = _build(certified.store, tmp_path / "out", "--key", str(keys / "gpucert-signing.pem"))
    public = str(keys / "gpucert-signing.pub.pem")
    code, lines = _verify(path, capsys, "--store", certified.store.as_uri(), "--public-key", public)
    assert code == 0, lines
    assert lines[0].startswith("ok    signature: valid, by the given key")

    code, lines = _verify(path, capsys, "--public-key", str(others / "gpucert-signing.pub.pem"))
    assert code == 3
    assert "not by the given key" in lines[-1]

    text = path.read_text()
    summary = json.loads(text)["runs"][0]["nodes"][0]["decision"]["summary"]
    changed = path.with_name("changed.json")
    changed.write_text(text.replace(json.dumps(summary), json.dumps(summary[:-1] + "!"), 1))
    code, lines = _verify(changed, capsys, "--public-key", public)
    assert code == 3
    assert lines[-1].startswith("the certificate does NOT verify: signature: the signature does not match")
    # Without the key, the embedded one still catches the change.
    assert _verify(changed, capsys)[0] == 3

    unsigned = _build(certified.store, tmp_path / "unsigned")
    code, lines = _verify(unsigned, capsys, "--public-key", public)
    assert code == 3
    assert "not signed" in lines[-1]


def test_keygen_and_the_certificate_make_their_out_folders(
    certified: Certified, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``certificate keygen --out ~/.gpucert`` on a fresh machine (no such folder yet) used to fail as "not a
    folder"; the key folder is made its owner's only, and the certificate's --out folder is made too."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    assert main(["certificate", "keygen", "--out", "~/.gpucert"]) == 0
    keys = tmp_path / "home" / ".gpucert"
    assert (keys / "gpucert-signing.pem").is_file()
    assert keys.stat().st_mode & 0o077 == 0
    out = tmp_path / "shared" / "certificates"
    assert (
        main(
            [
                "certificate",
                "--store",
                certified.store.as_uri(),
                "--run",
                NIGHT,
                "--out",
                str(out),
                "--key",
                str(keys / "gpucert-signing.pem"),
            ]
        )
        == 0
    )
    assert verify_certificate(read_certificate(out / f"certificate-{NIGHT}.json")).ok


def test_the_signature_holds_over_the_canonical_body_whatever_the_layout(certified: Certified, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    assert main(["certificate", "keygen", "--out", str(keys)]) == 0
    path = _build(certified.store, tmp_path / "out", "--key", str(keys / "gpucert-signing.pem"))
    compact = path.with_name("compact.json")
    compact.write_text(json.dumps(json.loads(path.read_text()), separators=(",", ":")))
    again = read_certificate(compact)
    assert again.sha256 == read_certificate(path).sha256
    assert verify_certificate(again).ok
    assert "Signed" in render_certificate_html(again)


def _python_canonical(value: object) -> bytes:
    """What gpucert signed before RFC 8785 (schema /1): Python's JSON, keys sorted, floats as their repr."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def _thresholds(run: dict[str, Any]) -> dict[str, Any]:
    record = run["policy"]["record"]
    return {"policy": record["policy"], "spec_floors": record["spec_floors"]}


def test_the_signed_bytes_are_rfc_8785_and_verify_without_gpucert(certified: Certified, tmp_path: Path) -> None:
    # A verifier in another language has the file, a JCS (RFC 8785) library and Ed25519: nothing of gpucert's.
    keys = tmp_path / "keys"
    keys.mkdir()
    assert main(["certificate", "keygen", "--out", str(keys)]) == 0
    path = _build(certified.store, tmp_path / "out", "--key", str(keys / "gpucert-signing.pem"))
    body = json.loads(path.read_text(encoding="utf-8"))
    signature = body.pop("signature")
    signed = rfc8785.dumps(body)
    # The body holds numbers that RFC 8785 and Python's float repr write differently (an integral float,
    # say): on bytes made from the repr this signature would not hold.
    assert signed != _python_canonical(body)

    raw_key = base64.b64decode(signature["public_key"], validate=True)
    embedded = Ed25519PublicKey.from_public_bytes(raw_key)
    # Raises InvalidSignature when the signature does not hold over these bytes.
    embedded.verify(base64.b64decode(signature["value"]), signed)
    assert hashlib.sha256(raw_key).hexdigest() == signature["key_sha256"]
    pem = serialization.load_pem_public_key((keys / "gpucert-signing.pub.pem").read_bytes())
    assert pem.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw) == raw_key
    # The policy's fingerprint is RFC 8785 too: the recorded thresholds reproduce it.
    for run in body["runs"]:
        assert hashlib.sha256(rfc8785.dumps(_thresholds(run))).hexdigest() == run["policy"]["sha256"]


def test_a_certificate_of_the_legacy_schema_still_verifies_as_it_was_signed(
    certified: Certified, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Made here as gpucert made them before RFC 8785: schema /1, Python's canonical JSON for the policy's
    # fingerprint and for the signed bytes.
    body = build_certificate(open_store(certified.store.as_uri()), NIGHT).to_dict()
    body["schema"] = "gpucert.certificate/1"
    for run in body["runs"]:
        run["policy"]["sha256"] = hashlib.sha256(_python_canonical(_thresholds(run))).hexdigest()
    key = Ed25519PrivateKey.generate()
    raw_key = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    body["signature"] = {
        "algorithm": "Ed25519",
        "public_key": base64.b64encode(raw_key).decode(),
        "key_sha256": hashlib.sha256(raw_key).hexdigest(),
        "value": base64.b64encode(key.sign(_python_canonical(body))).decode(),
    }
    path = tmp_path / "legacy.json"
    path.write_text(json.dumps(body, indent=1))
    code, lines = _verify(path, capsys, "--store", certified.store.as_uri())
    assert code == 0, lines
    assert lines[0].startswith("ok    signature: valid, by the embedded key")


def test_a_certificate_signs_the_rfc_8785_bytes_of_its_body() -> None:
    # RFC 8785 writes numbers as ECMAScript does (1.0 is 1, 1e-5 is 0.00001, 1e21 is 1e+21) and sorts keys
    # by UTF-16 code units (U+1F600 sorts before U+FF5E; by code point it would sort after).
    body = {"schema": SCHEMA, "runs": [], "n": [1.0, 1e-5, 1e21, 2.5, -0.0], "\U0001f600": 1, "\uff5e": "é\n"}
    cert = Certificate(body)
    expected = '{"n":[1,0.00001,1e+21,2.5,0],"runs":[],"schema":"gpucert.certificate/2","\U0001f600":1,"\uff5e":"é\\n"}'
    assert cert.canonical() == expected.encode()
    signed = sign(cert, Ed25519PrivateKey.generate())
    assert check_signature(signed, None)[0]
    assert signed.sha256 == hashlib.sha256(expected.encode()).hexdigest()
    # The legacy schema keeps its own bytes, so what was signed under it still checks.
    assert Certificate({**body, "schema": "gpucert.certificate/1"}).canonical() == _python_canonical(
        {**body, "schema": "gpucert.certificate/1"}
    )


def test_a_run_without_a_recorded_policy_cannot_be_certified(
    certified: Certified, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = certified.copy(tmp_path / "store")
    (Certified.folder(store) / "policy.json").unlink()
    capsys.readouterr()
    out = tmp_path / "out"
    out.mkdir()
    assert main(["certificate", "--store", store.as_uri(), "--run", NIGHT, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "/policy.json: not in the store" in err
    # Every run since a day: the one that cannot be certified is named, the others certified.
    assert main(["certificate", "--store", store.as_uri(), "--since", "2000-01-01", "--out", str(out)]) == 0
    since = next(out.glob("certificate-since-*.json"))
    body = json.loads(since.read_text())
    assert [r["run_id"] for r in body["runs"]] == ["cert-seed"]
    assert [s["run_id"] for s in body["skipped"]] == [NIGHT]
    assert main(["certificate", "verify", str(since), "--store", store.as_uri()]) == 0


def test_the_gpus_are_named_by_the_serials_the_payload_recorded(certified: Certified, tmp_path: Path) -> None:
    # The payload records serial.<gpu> from NVML where the board reports one (the simulator's boards do not).
    store = certified.copy(tmp_path / "store")
    stack = Certified.folder(store) / "stack.json"
    stacks = json.loads(stack.read_text())
    stacks[certified.pcie]["serial.2"] = "1654922011863"
    stack.write_text(json.dumps(stacks))
    cert = build_certificate(open_store(store.as_uri()), NIGHT)
    [run] = cert.runs
    gpus = {(n["node"], g["gpu"]): g for n in run["nodes"] for g in n["gpus"]}
    assert gpus[(certified.pcie, 2)]["serial"] == "1654922011863"
    assert gpus[(certified.pcie, 1)]["serial"] is None
    assert "1654922011863" in render_certificate_html(cert)


def test_bad_input_is_one_line_and_exit_2(
    certified: Certified, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = certified.store.as_uri()
    not_json = tmp_path / "not.json"
    not_json.write_text("{ nope")
    foreign = tmp_path / "foreign.json"
    foreign.write_text('{"schema": "something/else"}')
    bad_key = tmp_path / "bad.pem"
    bad_key.write_text("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    keys = tmp_path / "keys"
    keys.mkdir()
    assert main(["certificate", "keygen", "--out", str(keys)]) == 0
    unsigned = _build(certified.store, tmp_path / "out")
    public = keys / "gpucert-signing.pub.pem"
    capsys.readouterr()
    cases = {
        "missing certificate": (["verify", str(tmp_path / "none.json")], "cannot read the certificate"),
        "not JSON": (["verify", str(not_json)], "not JSON"),
        "not a certificate": (["verify", str(foreign)], "not a gpucert certificate"),
        "a private key as public key": (
            ["verify", str(unsigned), "--public-key", str(keys / "gpucert-signing.pem")],
            "not a PEM public key",
        ),
        "a broken private key": (
            ["--store", uri, "--run", NIGHT, "--out", str(tmp_path), "--key", str(bad_key)],
            "not a PEM private key",
        ),
        "a public key as private key": (
            ["--store", uri, "--run", NIGHT, "--key", str(public)],
            "not a PEM private key",
        ),
        "unknown run": (["--store", uri, "--run", "no-such-run", "--out", str(tmp_path)], "no run no-such-run"),
        "not a date": (["--store", uri, "--since", "yesterday"], "--since yesterday: not a date"),
        "neither run nor since": (["--store", uri], "give --run RUN_ID or --since DATE"),
        "no store": (["--run", NIGHT], "give --store URI"),
        "missing store": (["--store", (tmp_path / "nowhere").as_uri(), "--run", NIGHT], "no store at"),
        "out is no folder": (["--store", uri, "--run", NIGHT, "--out", str(not_json)], "not a folder"),
        "nothing to verify": (["verify", str(unsigned)], "nothing to verify"),
        "keys exist": (["keygen", "--out", str(keys)], "exists; keys are never overwritten"),
    }
    for case, (args, words) in cases.items():
        assert main(["certificate", *args]) == 2, case
        captured = capsys.readouterr()
        assert captured.err.startswith("gpucert: "), (case, captured.err)
        assert captured.err.count("\n") == 1, (case, captured.err)
        assert words in captured.err, (case, captured.err)
        assert "Traceback" not in captured.err + captured.out


def test_the_s3_store_serves_the_same_certificate(
    certified: Certified, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("moto.server", reason="moto[server] is not installed (the test extra)")
    nowhere = str(tmp_path / "no-aws-config")
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in (
        ("AWS_CONFIG_FILE", nowhere),
        ("AWS_SHARED_CREDENTIALS_FILE", nowhere),
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
        ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
        ("AWS_DEFAULT_REGION", REGION),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ):
        monkeypatch.setenv(name, value)
    with moto_server() as endpoint:
        s3_client(endpoint).create_bucket(Bucket="gpucert-cert")
        monkeypatch.setenv("GPUCERT_S3_ENDPOINT", endpoint)
        target = BaselineStore(S3ObjectStore("gpucert-cert", "prod", endpoint_url=endpoint, region=REGION))
        for path in sorted(p for p in certified.store.rglob("*") if p.is_file() and not p.name.startswith(".")):
            target.objects.put(path.relative_to(certified.store).as_posix(), path.read_bytes())
        cert = _build_s3(tmp_path / "out")
        code, lines = _verify(cert, capsys, "--store", "s3://gpucert-cert/prod")
        assert code == 0, lines
        assert json.loads(cert.read_text())["store"] == "s3://gpucert-cert/prod"
        # The certificate made from the file store verifies against its copy in the bucket too.
        local = _build(certified.store, tmp_path / "local")
        assert _verify(local, capsys, "--store", "s3://gpucert-cert/prod")[0] == 0


def _build_s3(out: Path) -> Path:
    out.mkdir()
    assert main(["certificate", "--store", "s3://gpucert-cert/prod", "--run", NIGHT, "--out", str(out)]) == 0
    return out / f"certificate-{NIGHT}.json"
