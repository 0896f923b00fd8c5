"""A throwaway certificate authority for the TLS tests, made with the `openssl` command in a tmp dir: the CA,
an agent certificate, a second server certificate from the same CA (a relay on a compromised host), and a
manager client certificate. All for 127.0.0.1/localhost, valid for two days."""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CertSet:
    ca: Path
    agent_cert: Path
    agent_key: Path
    relay_cert: Path
    relay_key: Path
    client_cert: Path
    client_key: Path


def unavailable() -> str | None:
    return None if shutil.which("openssl") else "needs the openssl command to make a test CA"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _issue(d: Path, name: str, usage: str) -> None:
    (d / f"{name}.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=critical,CA:FALSE\n"
                                   f"keyUsage=critical,digitalSignature\nextendedKeyUsage={usage}\n"
                                   "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n")
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
             f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=tcplab-test-{name}", cwd=d)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)


def make_test_ca(d: Path) -> CertSet:
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
             "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=tcplab-test-ca",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             cwd=d)
    for name, usage in (("agent", "serverAuth"), ("relay", "serverAuth"), ("manager", "clientAuth")):
        _issue(d, name, usage)
    return CertSet(d / "ca.pem", d / "agent.pem", d / "agent.key", d / "relay.pem", d / "relay.key",
                  d / "manager.pem", d / "manager.key")
