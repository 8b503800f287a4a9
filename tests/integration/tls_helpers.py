"""A TLS-only redis-server with an ACL user, and certificates made at test time.

Why: managed Redis services take ``rediss://`` connections only and hand out an ACL user
(not the default user) that may touch only some commands, keys and channels. These helpers
make a private CA and a server certificate with the ``openssl`` CLI, start ``redis-server``
on a free TLS port (the plain port closed), disable the default user's passwordless access
and create the user that ``ACL_RULE`` (the rule docs/howto/topologies.md documents) allows.
Nothing here touches the machine's shared Redis.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.conftest import ROOT, free_port, wait_for

__all__ = ["ACL_RULE", "Certificates", "TlsRedisServer", "make_certificates"]


def documented_rule() -> tuple[str, ...]:
    """The words after ``ACL SETUSER jobbers reset on '>PASSWORD'`` in the ``redis-cli``
    block of docs/howto/topologies.md (section "The ACL rule", where each command's reason
    is given): the rule is written in one place, and the tests create exactly that user."""
    text = (ROOT / "docs" / "howto" / "topologies.md").read_text()
    start = text.index("redis-cli --tls")
    words = shlex.split(text[start:text.index("```", start)].replace("\\\n", " "))
    at = words.index("SETUSER")
    assert words[at + 1:at + 5] == ["jobbers", "reset", "on", ">PASSWORD"], words[:at + 5]
    return tuple(words[at + 5:])


#: The ACL rule jobbers (the state store), Celery's Redis broker (kombu) and Celery's Redis
#: result backend need, for the default key prefix ``jobbers``, the default queue
#: ``celery`` and database 0, as docs/howto/topologies.md documents it.
ACL_RULE: tuple[str, ...] = documented_rule()


class Certificates:
    """Paths of a test CA and of a server certificate signed by it (for 127.0.0.1)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.ca = directory / "ca.pem"
        self.ca_key = directory / "ca.key"
        self.server = directory / "server.pem"
        self.server_key = directory / "server.key"


def _openssl(*args: str, cwd: Path) -> None:
    binary = shutil.which("openssl")
    if binary is None:
        pytest.fail("openssl is not installed (apt-get install openssl); the TLS tests make "
                    "their certificates with it", pytrace=False)
    subprocess.run([binary, *args], cwd=cwd, check=True, capture_output=True)


def make_certificates(directory: Path) -> Certificates:
    """A CA, and a server certificate for ``localhost``/``127.0.0.1`` that it signed, made
    with the extensions Python's strict verification expects (CA basic constraints, key
    usages, subject alternative names)."""
    certs = Certificates(directory)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=jobbers test CA",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=directory)
    _openssl("req", "-new", *ec, "-keyout", "server.key", "-out", "server.csr",
             "-subj", "/CN=localhost", cwd=directory)
    (directory / "server.ext").write_text(
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
        "authorityKeyIdentifier=keyid,issuer\n"
    )
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.pem", "-days", "2",
             "-extfile", "server.ext", cwd=directory)
    return certs


class TlsRedisServer:
    """A private ``redis-server`` that accepts TLS connections only, with ACL users.

    The default user gets a password (the test's admin connection); ``user`` is created
    with exactly ``ACL_RULE``.
    """

    admin_password = "admin-pw"
    user = "jobbers"
    password = "jobbers-pw/+ &?"  # needs quoting in a URL, as real generated ones do

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed (apt-get install redis-server)",
                        pytrace=False)
        self.dir = Path(tempfile.mkdtemp(prefix="jobbers-tls-"))
        self.certs = make_certificates(self.dir)
        self.port = free_port()
        self.proc = subprocess.Popen(
            [binary, "--port", "0", "--tls-port", str(self.port), "--bind", "127.0.0.1",
             "--tls-cert-file", str(self.certs.server),
             "--tls-key-file", str(self.certs.server_key),
             "--tls-ca-cert-file", str(self.certs.ca), "--tls-auth-clients", "no",
             "--save", "", "--appendonly", "no", "--dir", str(self.dir),
             "--maxmemory-policy", "noeviction", "--logfile", str(self.dir / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )
        wait_for(self._answers, timeout=10, message="the TLS redis-server to answer")
        admin = self.admin()
        admin.acl_setuser("default", enabled=True, reset_passwords=True,
                          passwords=[f"+{self.admin_password}"])
        self.set_user(self.user, self.password, ACL_RULE)

    def _answers(self) -> bool:
        import redis

        if self.proc.poll() is not None:
            raise AssertionError("redis-server exited: "
                                 + (self.dir / "redis.log").read_text(errors="replace"))
        try:
            client = self.client(username=None, password=None)
            return bool(client.ping())
        except (redis.ConnectionError, redis.AuthenticationError, redis.ResponseError):
            return False

    def client(self, username: str | None = "default", password: str | None = None,
               **options: Any) -> Any:
        """A verified TLS client (as ``username``; the admin by default)."""
        import redis

        if username == "default" and password is None:
            password = self.admin_password
        return redis.Redis(host="127.0.0.1", port=self.port, ssl=True,
                           ssl_ca_certs=str(self.certs.ca), ssl_cert_reqs="required",
                           username=username, password=password, decode_responses=True,
                           **options)

    def admin(self) -> Any:
        return self.client()

    def set_user(self, name: str, password: str, rule: tuple[str, ...]) -> None:
        """(Re)create ``name`` with ``password`` and exactly ``rule``."""
        self.admin().execute_command("ACL", "SETUSER", name, "reset", "on", f">{password}",
                                     *rule)

    def url(self, user: str | None = None, password: str | None = None,
            query: bool = True, ca: Path | None = None) -> str:
        """``rediss://user:password@127.0.0.1:port/0``, with the CA (``ca`` or the one that
        signed the server's certificate) as query parameters."""
        user = user or self.user
        password = self.password if password is None else password
        url = f"rediss://{quote(user, safe='')}:{quote(password, safe='')}@127.0.0.1:{self.port}/0"
        if query:
            ca_file = quote(str(ca or self.certs.ca), safe="")
            url += f"?ssl_cert_reqs=required&ssl_ca_certs={ca_file}"
        return url

    def acl_denials(self) -> list[dict[str, Any]]:
        """What the server refused since the last ``ACL LOG RESET`` (NOPERM, bad AUTH)."""
        return list(self.admin().acl_log(count=100))

    def flush(self) -> None:
        admin = self.admin()
        admin.flushall()
        admin.acl_log_reset()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)
