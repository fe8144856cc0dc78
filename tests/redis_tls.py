"""A private `redis-server` speaking TLS with ACL users: certificates made by `openssl` for the
run (a CA and a server certificate for 127.0.0.1), the plain port kept for the test's own
administration (the default user), the TLS port for stickless's users."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from stickless.local_services import RedisServer, free_port

from .redis_fixture import redis_executable

#: The user's password in every URL below.
PASSWORD = "s3cret-pw"


def openssl() -> str:
    """The `openssl` on PATH; fails under CI=true and skips otherwise when it is missing."""
    found = shutil.which("openssl")
    if found is not None:
        return found
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail("openssl is not on PATH but CI=true requires the TLS tests (apt-get install)")
    pytest.skip("openssl is not on PATH")


def make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A CA, and a server key and certificate it signed for 127.0.0.1 and localhost."""
    tool = openssl()
    ca_key, ca_crt = directory / "ca.key", directory / "ca.crt"
    key, csr, crt = directory / "server.key", directory / "server.csr", directory / "server.crt"
    names = directory / "names.ext"
    names.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    steps = [
        [tool, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-keyout", str(ca_key), "-out", str(ca_crt), "-subj", "/CN=stickless-test-ca"],
        [tool, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
         "-subj", "/CN=127.0.0.1"],
        [tool, "x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key),
         "-CAcreateserial", "-days", "2", "-out", str(crt), "-extfile", str(names)],
    ]  # fmt: skip
    for step in steps:
        subprocess.run(step, check=True, capture_output=True, timeout=60)
    return ca_crt, key, crt


def user(name: str, *rules: str) -> list[str]:
    """The directive that defines ACL user `name` (password PASSWORD) with `rules`."""
    return ["--user", name, "on", f">{PASSWORD}", *rules]


@dataclass
class TlsRedis:
    """The server, its TLS port and the CA file that signed its certificate."""

    server: RedisServer
    tls_port: int
    ca: Path

    def url(self, name: str) -> str:
        """The `rediss://` URL of user `name` (the CA passed separately)."""
        return f"rediss://{name}:{PASSWORD}@127.0.0.1:{self.tls_port}/0"


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    """A TLS redis-server with users `stickless` (namespace `tlsns`), `demo` (every `cluster-*`
    namespace), `nokeys` (another namespace's keys), `nochannels` (no channel) and `noinfo`."""
    directory = tmp_path_factory.mktemp("tls-redis")
    ca, key, crt = make_certificates(directory)
    tls_port = free_port()
    users = [
        *user("stickless", "~tlsns:*", "~{tlsns:s:*", "&tlsns:*", "+@all", "-@dangerous", "+info"),
        *user("demo", "~cluster-*", "~{cluster-*", "&cluster-*", "+@all", "-@dangerous", "+info"),
        *user("nokeys", "~other:*", "&tlsns:*", "+@all", "-@dangerous", "+info"),
        *user("nochannels", "~tlsns:*", "~{tlsns:s:*", "+@all", "-@dangerous", "+info"),
        *user("noinfo", "~tlsns:*", "~{tlsns:s:*", "&tlsns:*", "+@all", "-@dangerous"),
    ]
    tls = [
        "--tls-port", str(tls_port), "--tls-cert-file", str(crt), "--tls-key-file", str(key),
        "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no",
    ]  # fmt: skip
    server = RedisServer(directory, executable=redis_executable(), extra_args=[*tls, *users])
    server.start()
    try:
        yield TlsRedis(server, tls_port, ca)
    finally:
        server.stop()
