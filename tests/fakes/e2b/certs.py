"""A throwaway CA and a server certificate for 127.0.0.1 and localhost it
signed, made
with the openssl command, for serving the fake over TLS in tests and
benchmarks (a client that sends an API key only over https needs it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make(directory: Path) -> "tuple[Path, Path, Path]":
    """Writes the CA and the server's certificate and key into `directory`;
    returns (ca.pem, leaf.pem, leaf.key)."""
    d = Path(directory)
    _openssl("req", "-x509", *_EC, "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"),
             "-days", "2", "-subj", "/CN=fake-e2b-test-ca")
    _openssl("req", *_EC, "-keyout", str(d / "leaf.key"), "-out", str(d / "leaf.csr"),
             "-subj", "/CN=fake-e2b")
    (d / "ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
                           "extendedKeyUsage=serverAuth\n")
    _openssl("x509", "-req", "-in", str(d / "leaf.csr"), "-CA", str(d / "ca.pem"),
             "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-out", str(d / "leaf.pem"),
             "-days", "2", "-extfile", str(d / "ext"))
    return d / "ca.pem", d / "leaf.pem", d / "leaf.key"


def make_client(directory: Path) -> "tuple[Path, Path]":
    """A client certificate the CA that `make` wrote signed, for mutual TLS
    (fake-openshell); returns (client.pem, client.key)."""
    d = Path(directory)
    _openssl("req", *_EC, "-keyout", str(d / "client.key"), "-out", str(d / "client.csr"),
             "-subj", "/CN=plimsoll-test-client")
    (d / "client-ext").write_text("basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n")
    _openssl("x509", "-req", "-in", str(d / "client.csr"), "-CA", str(d / "ca.pem"),
             "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-out", str(d / "client.pem"),
             "-days", "2", "-extfile", str(d / "client-ext"))
    return d / "client.pem", d / "client.key"
