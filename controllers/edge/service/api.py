"""The edge topology HTTP API: read and change origin capacity/health and edge→origin latency at run
time, read the current weights and decision status. OpenAPI 3 spec at ``GET /openapi.json``.

* Bearer token (``Authorization: Bearer <token>``) on every ``/v1`` route, compared in constant time
  (:func:`hmac.compare_digest`); 401 without it. The token is read from a file (re-read when it changes:
  :class:`~opsloop.controllers.edge.service.api_token.TokenFile`) or the environment and never logged; while
  the file gives no usable token every ``/v1`` request gets 503. ``/openapi.json`` is public (it holds no data).
* Binds loopback by default (``controllers.edge.api.bind``). A slow or idle client is cut off after
  ``timeout_s``: a request (line, headers and body) must arrive whole within it from when it is awaited, not
  only each read (a client sending a header byte every few seconds held its connection slot for ever, and
  ``max_connections`` of them, no token needed, kept every operator out); a request cut so is logged
  (``api_headers_timeout``, ``api_body_timeout``; sampled: one line a minute each) and counted in
  ``opsloop_edge_api_requests_cut_total{reason="headers"|"body"}`` (a cut while the headers trickled went
  unsaid); an idle kept-alive connection closed is not; at most ``max_connections`` are
  served at once, more get 503 at
  once; the token is checked before the body is read (an unauthenticated client cannot make the
  server read 64 KiB); the request line is logged as its path only (no query string, no
  ``user:password@`` of an absolute URL).
* Every change goes through :class:`~opsloop.controllers.edge.service.store.TopologyStore`, which validates
  it and writes an audit record (before/after, reason). The next controller interval uses it.

Plain :mod:`http.server` (threaded): a handful of small JSON requests, no event loop to share.
"""

from __future__ import annotations

import io
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import unquote, urlsplit

import orjson
from prometheus_client import Counter

from opsloop.controllers.edge.service import metrics as M
from opsloop.controllers.edge.service.api_token import ApiToken, StaticToken
from opsloop.controllers.edge.service.store import TopologyError, TopologyStore
from opsloop.log import Sampled, get_logger

log = get_logger("controller.edge.api")
MAX_BODY = 64 * 1024
TIMEOUT_S = 10.0
MAX_CONNECTIONS = 32
_NAME = r"([^/]+)"
REFUSED = Counter("opsloop_edge_api_refused_connections_total",
                  "Edge API connections answered 503 because max_connections were open")


def _origin_schema() -> dict[str, Any]:
    return {"type": "object", "properties": {
        "listener": {"type": "string"}, "origin": {"type": "string"},
        "capacity_rps": {"type": "number", "minimum": 0}, "healthy": {"type": "boolean"},
        "health_override": {"type": ["boolean", "null"]}}}


def openapi_spec() -> dict[str, Any]:
    err = {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    common = {"401": {"description": "missing or wrong bearer token"}, "404": err, "400": err,
              "503": {**err, "description": "the service has no usable bearer token (its token file is empty or "
                                            "unreadable): every request is refused until it is fixed"}}
    origin_ok = {"200": {"description": "the origin after the change",
                         "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Origin"}}}}}
    lo = [{"name": "listener", "in": "path", "required": True, "schema": {"type": "string"}},
          {"name": "origin", "in": "path", "required": True, "schema": {"type": "string"}}]

    def body(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
        return {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "additionalProperties": False, "required": required,
            "properties": {**props, "reason": {"type": "string", "maxLength": 1000}}}}}}

    return {
        "openapi": "3.0.3",
        "info": {"title": "opsloop edge control API", "version": "1.0.0",
                 "description": "Source of truth of the edge-weight controller: origin capacity and health, "
                                "edge→origin latency; current weights and decision status. Changes are "
                                "audited and used from the next controller interval."},
        "security": [{"bearer": []}],
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Origin": _origin_schema(),
                        "Error": {"type": "object", "properties": {"error": {"type": "string"}}}}},
        "paths": {
            "/v1/topology": {"get": {"summary": "the whole topology with health overrides",
                                     "responses": {"200": {"description": "topology"}, **common}}},
            "/v1/status": {"get": {"summary": "last decision per listener: mode, reason, version, inputs; "
                                              "publish_failure: the last failed publish until one succeeds; "
                                              "last_tick: the last tick attempted (outcome, error); "
                                              "decision_age_s: seconds since the decision in force",
                                   "responses": {"200": {"description": "status"}, **common}}},
            "/v1/listeners/{listener}/weights": {"get": {
                "summary": "current published weights (EdgeWeights records)", "parameters": lo[:1],
                "responses": {"200": {"description": "records"}, **common}}},
            "/v1/listeners/{listener}/origins/{origin}": {"get": {
                "summary": "origin capacity and health", "parameters": lo, "responses": {**origin_ok, **common}}},
            "/v1/listeners/{listener}/origins/{origin}/capacity": {
                "get": {"summary": "origin capacity", "parameters": lo, "responses": {**origin_ok, **common}},
                "put": {"summary": "set the origin's capacity (req/s)", "parameters": lo,
                        "requestBody": body({"capacity_rps": {"type": "number", "minimum": 0}}, ["capacity_rps"]),
                        "responses": {**origin_ok, **common}}},
            "/v1/listeners/{listener}/origins/{origin}/health": {
                "get": {"summary": "origin health", "parameters": lo, "responses": {**origin_ok, **common}},
                "put": {"summary": "pin the origin's health (null: follow the load balancers' checks; true does "
                                   "not override a load balancer's DOWN unless force is true)",
                        "parameters": lo,
                        "requestBody": body({"healthy": {"type": ["boolean", "null"]},
                                             "force": {"type": "boolean", "default": False}}, ["healthy"]),
                        "responses": {**origin_ok, **common}}},
            "/v1/listeners/{listener}/edges/{edge}/latency/{origin}": {"put": {
                "summary": "set edge→origin latency (ms; null = no path)",
                "parameters": [lo[0], {"name": "edge", "in": "path", "required": True, "schema": {"type": "string"}},
                               lo[1]],
                "requestBody": body({"latency_ms": {"type": ["number", "null"], "minimum": 0}}, ["latency_ms"]),
                "responses": {"200": {"description": "the pair after the change"}, **common}}},
        },
    }


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


Route = tuple[str, re.Pattern[str], Callable[..., Any]]


class EdgeApi:
    """Routes → store/loop calls. ``status_fn()`` and ``weights_fn(listener)`` come from the loop."""

    def __init__(self, store: TopologyStore, token: str | ApiToken, status_fn: Callable[[], dict[str, Any]],
                 weights_fn: Callable[[str], list[dict[str, Any]]]) -> None:
        self.token = StaticToken(token) if isinstance(token, str) else token
        self._cut_log = Sampled(60.0)   # per phase: a trickling client must not flood the log
        self.store = store
        self.status_fn = status_fn
        self.weights_fn = weights_fn
        self.server: ThreadingHTTPServer | None = None
        lo = rf"^/v1/listeners/{_NAME}/origins/{_NAME}"
        self.routes: list[Route] = [
            ("GET", re.compile(r"^/v1/topology$"), lambda body: store.topology()),
            ("GET", re.compile(r"^/v1/status$"), lambda body: self.status_fn()),
            ("GET", re.compile(rf"^/v1/listeners/{_NAME}/weights$"), self._weights),
            ("GET", re.compile(lo + r"(?:/capacity|/health)?$"), lambda body, l, o: store.origin(l, o)),
            ("PUT", re.compile(lo + r"/capacity$"), lambda body, l, o: store.set_capacity(
                l, o, _field(body, "capacity_rps"), _reason(body))),
            ("PUT", re.compile(lo + r"/health$"), lambda body, l, o: store.set_health(
                l, o, _field(body, "healthy", optional=("force",)), _reason(body), force=body.get("force", False))),
            ("PUT", re.compile(rf"^/v1/listeners/{_NAME}/edges/{_NAME}/latency/{_NAME}$"),
             lambda body, l, e, o: store.set_latency(l, e, o, _latency(body), _reason(body))),
        ]

    def _weights(self, body: Any, listener: str) -> Any:
        self.store.snapshot(listener)  # 404 for an unknown listener
        return {"listener": listener, "records": self.weights_fn(listener)}

    def authorized(self, header: str | None) -> bool:
        return self.refusal(header) is None

    def refusal(self, header: str | None) -> tuple[int, dict[str, Any]] | None:
        """None when ``header`` carries the token; else the answer: 401, or 503 while there is no usable token
        (checked first: no token can be right then)."""
        presented = header[len("Bearer "):].strip() if header and header.startswith("Bearer ") else None
        ok = self.token.matches(presented or "")
        if ok is None:
            return 503, {"error": "the edge API has no usable bearer token (its token file is empty, unreadable or "
                                  "open to others; see the service log, event api_token_unusable)"}
        if presented is None or not ok:
            return 401, {"error": "missing or wrong bearer token"}
        return None

    def request_cut(self, reason: str, method: str | None, path: str | None, client: str, received: int,
                    timeout_s: float) -> None:
        """A request not whole within ``timeout_s`` (``reason``: headers, body), cut unanswered: counted, logged
        sampled per reason."""
        M.API_REQUESTS_CUT.labels(reason).inc()
        self._cut_log.warning(log, f"api_{reason}_timeout", key=reason, method=method, path=path, client=client,
                              bytes_received=received, timeout_s=timeout_s)

    def needs_token(self, path: str) -> bool:
        return request_path(path).startswith("/v1/")

    def dispatch(self, method: str, path: str, auth: str | None, raw: bytes) -> tuple[int, Any]:
        path = request_path(path)
        if method == "GET" and path == "/openapi.json":
            return 200, openapi_spec()
        if not path.startswith("/v1/"):
            return 404, {"error": f"no such path {path!r} (see /openapi.json)"}
        denied = self.refusal(auth)
        if denied is not None:
            return denied
        matched_path = False
        for m, pattern, fn in self.routes:
            match = pattern.match(path)
            if not match:
                continue
            matched_path = True
            if m != method:
                continue
            try:   # names are percent-encoded in a path (a listener "192.0.2.1:443/tcp", an origin "dc 2")
                names = [unquote(g, errors="strict") for g in match.groups()]
            except UnicodeDecodeError as e:
                return 400, {"error": f"a name in the path is not UTF-8 once percent-decoded: {e.reason}"}
            try:
                body = _parse_body(raw) if method == "PUT" else None
                return 200, fn(body, *names)
            except TopologyError as e:
                return e.status, {"error": str(e)}
            except ApiError as e:
                return e.status, {"error": str(e)}
        if matched_path:
            return 405, {"error": f"method {method} not allowed on {path}"}
        return 404, {"error": f"no such path {path!r} (see /openapi.json)"}

    # -- server ------------------------------------------------------------------------------
    def serve(self, bind: str = "127.0.0.1", port: int = 0, timeout_s: float = TIMEOUT_S,
              max_connections: int = MAX_CONNECTIONS) -> ThreadingHTTPServer:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = timeout_s   # socket timeout: a slow or idle client cannot hold a thread forever

            def log_message(self, format: str, *args: object) -> None:  # no header/token leakage
                pass

            def setup(self) -> None:
                super().setup()
                self._reads = _RequestDeadline(self.connection, timeout_s)
                self.rfile = io.BufferedReader(self._reads)

            def handle_one_request(self) -> None:
                self._reads.restart()   # the next request (or the wait for it) has timeout_s from now
                self.raw_requestline = b""
                super().handle_one_request()   # a read timing out ends it quietly (log_message is silenced)
                if self._reads.timed_out and self._reads.received and not self._reads.said:
                    # cut while its line or headers trickled in; no bytes at all: an idle kept-alive connection
                    line = self.raw_requestline.decode("latin-1").split()
                    api.request_cut("headers", line[0][:16] if line else None,
                                    request_path(line[1])[:200] if len(line) > 1 else None, self.client_address[0],
                                    self._reads.received, timeout_s)

            def _handle(self, method: str) -> None:
                path = request_path(self.path)
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                except ValueError:
                    length = -1
                denied = api.refusal(self.headers.get("Authorization")) if api.needs_token(self.path) else None
                if denied is not None:
                    status, doc = denied
                    self.close_connection = length != 0   # the unread body must not be taken for a request
                elif length < 0:
                    status, doc = 400, {"error": "Content-Length: not a non-negative integer"}
                    self.close_connection = True
                elif length > MAX_BODY:
                    status, doc = 413, {"error": f"body larger than {MAX_BODY} bytes"}
                    self.close_connection = True
                else:
                    try:
                        raw = self.rfile.read(length) if length > 0 else b""
                    except (TimeoutError, socket.timeout):
                        self._reads.said = True
                        api.request_cut("body", method, path, self.client_address[0], self._reads.received,
                                        timeout_s)
                        self.close_connection = True
                        return
                    try:
                        status, doc = api.dispatch(method, self.path, self.headers.get("Authorization"), raw)
                    except Exception as e:  # noqa: BLE001 - a bug answers 500, never kills the server
                        log.error("api_error", method=method, path=path, error=f"{type(e).__name__}: {e}"[:500])
                        status, doc = 500, {"error": "internal error"}
                log.info("api_request", method=method, path=path, status=status)
                payload = orjson.dumps(doc)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                if status == 401:
                    self.send_header("WWW-Authenticate", 'Bearer realm="opsloop-edge"')
                if self.close_connection:
                    self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:  # noqa: N802
                self._handle("GET")

            def do_PUT(self) -> None:  # noqa: N802
                self._handle("PUT")

            def do_POST(self) -> None:  # noqa: N802
                self._handle("POST")

            def do_DELETE(self) -> None:  # noqa: N802
                self._handle("DELETE")

        try:
            server = _BoundedServer((bind, port), Handler, max_connections)
        except OSError as e:
            raise OSError(e.errno, f"cannot serve the edge API on {bind}:{port}: {e.strerror}") from None
        threading.Thread(target=server.serve_forever, name=f"edge-api:{port}", daemon=True).start()
        self.server = server
        return server

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.server_address[1])

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


class _RequestDeadline(io.RawIOBase):
    """A connection's reads, bounded together: each waits at most what is left of ``timeout_s`` since
    :meth:`restart` (the socket timeout alone bounds one read, so a trickle of bytes never ended)."""

    def __init__(self, sock: socket.socket, timeout_s: float) -> None:
        super().__init__()
        self.sock = sock
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.received = 0        # bytes of this request so far
        self.timed_out = False   # a read of this request timed out
        self.said = False        # the cut was already counted and logged

    def restart(self) -> None:
        self.deadline = time.monotonic() + self.timeout_s
        self.received, self.timed_out, self.said = 0, False, False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            self.timed_out = True
            raise TimeoutError(f"request not complete within {self.timeout_s:g} s")
        self.sock.settimeout(min(left, self.timeout_s))
        try:
            n = self.sock.recv_into(buffer)
        except TimeoutError:
            self.timed_out = True
            raise
        else:
            self.received += n
            return n
        finally:
            self.sock.settimeout(self.timeout_s)   # the reply's writes keep their own timeout


_BUSY_BODY = b'{"error": "too many open connections"}'
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
         + f"Content-Length: {len(_BUSY_BODY)}\r\n\r\n".encode() + _BUSY_BODY)


class _BoundedServer(ThreadingHTTPServer):
    """A thread per connection, at most ``max_connections`` at once: the next one gets 503 at once."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], max_connections: int) -> None:
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            REFUSED.inc()
            try:
                request.settimeout(1.0)
                request.sendall(_BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def request_path(target: str) -> str:
    """The path of a request target, for routing and logs: no query string, and for an absolute URL
    (``http://user:password@host/v1/...``) no scheme, host or credentials."""
    return urlsplit(target).path if "://" in target or target.startswith("//") else target.split("?", 1)[0]


def _parse_body(raw: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError as e:
        raise ApiError(400, f"body: not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ApiError(400, f"body: expected a JSON object, got {type(doc).__name__}")
    return doc


def _field(body: dict[str, Any], name: str, optional: tuple[str, ...] = ()) -> Any:
    if name not in body:
        raise ApiError(400, f"body: missing field {name!r}")
    unknown = sorted(set(body) - {name, "reason", *optional})
    if unknown:
        raise ApiError(400, f"body: unknown field(s) {unknown!r}")
    return body[name]


def _latency(body: dict[str, Any]) -> Any:
    value = _field(body, "latency_ms")
    return float("inf") if value is None else value


def _reason(body: dict[str, Any]) -> str:
    reason = body.get("reason", "")
    if not isinstance(reason, str) or len(reason) > 1000:
        raise ApiError(400, f"reason: expected a string of at most 1000 characters, got {str(reason)[:40]!r}")
    return reason
