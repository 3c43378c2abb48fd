"""Self-signed certificates for TLS tests, made with the openssl command (skipped without
it), and a server-side TLS context from them."""

from __future__ import annotations

import base64
import shutil
import ssl
import subprocess
from pathlib import Path

import pytest


def make_certificate(directory: Path, name: str, subject_alt_name: str) -> tuple[Path, Path]:
    """A self-signed certificate and its key, as files."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make a certificate")
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj",
                    f"/CN={name}", "-addext", f"subjectAltName={subject_alt_name}",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


def server_tls(cert: Path, key: Path, client_ca: Path | None = None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    if client_ca is not None:  # clients must show a certificate it signed
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(client_ca)
    return context


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()
