"""The S3 path of the source documents, on loopback: client -> nginx (front end, access log) -> gateway -> Keystone.

RadosGW cannot run here, so :class:`S3Gateway` stands in for it in the one respect that matters to
this collector: for every signed request it recomputes the SigV4 string-to-sign and asks Keystone
``POST /v3/s3tokens`` (with a service-role token) whether the signature is valid, answering 200 or
403. Anonymous requests are served without Keystone. ``?size=N`` makes the response N bytes long
so tests can produce "small" and large requests in the source documents' sense.

nginx is the real Debian nginx with the documented ``log_format s3_keystone``.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import requests

from opsloop.collectors.keystone import sigv4

from .server import free_port, stop_process_group

TEMPLATE = Path(__file__).with_name("nginx.conf.tmpl")
_AUTH = re.compile(r"^AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<date>\d{8})/(?P<region>[^/]+)/s3/aws4_request, "
                   r"SignedHeaders=host;x-amz-date, Signature=(?P<sig>[0-9a-f]{64})$")
MAX_BODY = 4 * 1024 * 1024


class _ServiceToken:
    """The gateway's Keystone service token (issued once, like RadosGW's admin token)."""

    def __init__(self, url: str, username: str, password: str, project: str) -> None:
        self.url, self._auth = url, {"auth": {
            "identity": {"methods": ["password"], "password": {"user": {
                "name": username, "domain": {"id": "default"}, "password": password}}},
            "scope": {"project": {"name": project, "domain": {"id": "default"}}}}}
        self._token: str | None = None
        self._lock = threading.Lock()

    def get(self) -> str:
        with self._lock:
            if self._token is None:
                resp = requests.post(f"{self.url}/v3/auth/tokens", json=self._auth, timeout=30)
                resp.raise_for_status()
                self._token = resp.headers["X-Subject-Token"]
            return self._token


class S3Gateway:
    """A stand-in for RadosGW: validates each signed request against Keystone, then answers."""

    def __init__(self, keystone_url: str, username: str, password: str, project: str) -> None:
        self.keystone_url = keystone_url.rstrip("/")
        self.token = _ServiceToken(self.keystone_url, username, password, project)
        self.port = free_port()
        self._local = threading.local()
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:  # nginx keeps the access log
                pass

            def do_GET(self) -> None:
                gateway._handle(self)

            do_PUT = do_HEAD = do_DELETE = do_POST = do_GET

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3-gateway", daemon=True)

    def _session(self) -> requests.Session:
        if not hasattr(self._local, "session"):
            self._local.session = requests.Session()
        return self._local.session

    def _validate(self, req: BaseHTTPRequestHandler) -> int:
        auth = req.headers.get("Authorization")
        if not auth:
            return 200  # anonymous: a public object, no Keystone round trip
        m = _AUTH.match(auth)
        date = req.headers.get("X-Amz-Date", "")
        if not m or not date:
            return 403
        parts = urlsplit(req.path)
        canonical = sigv4.canonical_request(req.command, parts.path, parts.query, req.headers.get("Host", ""), date)
        to_sign = sigv4.string_to_sign(canonical, date, m["region"])
        resp = self._session().post(f"{self.keystone_url}/v3/s3tokens", timeout=60,
                                    headers={"X-Auth-Token": self.token.get()},
                                    json=sigv4.s3tokens_body(m["key"], to_sign, m["sig"], date))
        return 200 if resp.status_code == 200 else 403

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        length = min(int(req.headers.get("Content-Length") or 0), MAX_BODY)
        if length:
            req.rfile.read(length)
        try:
            status = self._validate(req)
        except requests.RequestException:
            status = 503
        size = 0
        if status == 200:
            sizes = parse_qs(urlsplit(req.path).query).get("size", ["0"])
            size = min(int(sizes[0]) if sizes[0].isdigit() else 0, MAX_BODY)
        body = b"x" * size if req.command != "HEAD" else b""
        req.send_response(status)
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class NginxFrontend:
    """Debian's nginx on a loopback port, proxying to ``upstream`` and logging s3_keystone lines."""

    def __init__(self, workdir: Path, upstream_port: int, nginx: str | None = None) -> None:
        self.workdir = Path(workdir)
        self.port = free_port()
        self.upstream_port = upstream_port
        self.nginx = nginx or shutil.which("nginx") or "/usr/sbin/nginx"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def access_log(self) -> Path:
        return self.workdir / "s3-access.log"

    def start(self, ready_timeout_s: float = 20.0) -> None:
        if not os.path.exists(self.nginx):
            raise RuntimeError("nginx is missing: run `make setup` (setup.d/40-keystone.sh installs nginx-light)")
        (self.workdir / "tmp").mkdir(parents=True, exist_ok=True)
        conf = (TEMPLATE.read_text().replace("@WORKDIR@", str(self.workdir)).replace("@PORT@", str(self.port))
                .replace("@UPSTREAM@", f"127.0.0.1:{self.upstream_port}"))
        conf_path = self.workdir / "nginx.conf"
        conf_path.write_text(conf)
        self._proc = subprocess.Popen([self.nginx, "-c", str(conf_path), "-p", str(self.workdir),
                                       "-e", str(self.workdir / "nginx-error.log")],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                err = (self.workdir / "nginx-error.log").read_text(errors="replace")[-800:]
                raise RuntimeError(f"nginx exited {self._proc.returncode}: {err}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"nginx not listening on {self.port} after {ready_timeout_s:g} s")

    def stop(self) -> None:
        if self._proc is not None:
            stop_process_group(self._proc)
            self._proc = None


def signed_get(session: requests.Session, base_url: str, access: str, secret: str, path: str,
               size: int = 0) -> int:
    """One SigV4-signed GET through the front end; returns the HTTP status."""
    host = urlsplit(base_url).netloc
    query = f"size={size}" if size else ""
    signed = sigv4.sign_request(access, secret, "GET", path, host, query=query)
    resp = session.get(f"{base_url}{path}" + (f"?{query}" if query else ""), timeout=60,
                       headers={"Authorization": signed.authorization, "X-Amz-Date": signed.x_amz_date})
    return resp.status_code


def s3_load(base_url: str, plan: list[tuple[str, str, int]], concurrency: int = 4, size: int = 0) -> list[int]:
    """Send ``count`` signed GETs per (access, secret, count), interleaved, ``concurrency`` at a time."""
    jobs = [(a, s) for a, s, n in plan for _ in range(n)]
    random.Random(len(jobs)).shuffle(jobs)  # interleave credentials like independent clients
    local = threading.local()

    def one(job: tuple[str, str]) -> int:
        if not hasattr(local, "session"):
            local.session = requests.Session()
        return signed_get(local.session, base_url, job[0], job[1], "/bucket/object", size)

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(one, jobs))
