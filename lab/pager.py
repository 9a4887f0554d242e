"""A stand-in for the on-call pager in `make run`: receives Alertmanager webhooks on loopback and
appends each notification as one JSON line to a file, printing a one-line summary.

    python -m opsloop.lab.pager --port 28090 --out .run/pipeline/pager/pages.jsonl
"""

from __future__ import annotations

import argparse
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import orjson

MAX_BODY = 1 << 20


def make_handler(out: Path) -> type[BaseHTTPRequestHandler]:
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self.send_response(413)
                self.end_headers()
                return
            body = self.rfile.read(length)
            try:
                doc = orjson.loads(body)
            except orjson.JSONDecodeError:
                self.send_response(400)
                self.end_headers()
                return
            line = orjson.dumps({"receiver": self.path.strip("/"), "notification": doc}) + b"\n"
            with lock, out.open("ab") as f:
                f.write(line)
            for a in doc.get("alerts", []) if isinstance(doc, dict) else []:
                labels = a.get("labels", {})
                print(f"PAGE {a.get('status', '?'):8} {labels.get('severity', '?'):8} {labels.get('alertname', '?')} "
                      f"{a.get('annotations', {}).get('summary', '')}", flush=True)
            self.send_response(200)
            self.end_headers()

    return Handler


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m opsloop.lab.pager", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bind", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    server = ThreadingHTTPServer((a.bind, a.port), make_handler(a.out))
    server.daemon_threads = True
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
