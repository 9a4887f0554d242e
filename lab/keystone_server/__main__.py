"""Run the Keystone lab (Keystone + probe user + S3 users + nginx front end) until interrupted.

Something real for the Keystone collector to read, by hand (`opsloop run` does not start it).
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
from pathlib import Path

import yaml

from . import KeystoneLab, KeystoneServerError

EPILOG = """examples:
  python -m opsloop.lab.keystone_server --workdir /tmp/ks-lab
  python -m opsloop.lab.keystone_server --no-cache --s3-users 8     # the slow regime (hundreds of ms)
  python -m opsloop.lab.keystone_server --workdir /tmp/ks-lab --config-out /tmp/ks-lab/opsloop.yaml
      then: opsloop collect keystone --config /tmp/ks-lab/opsloop.yaml --once --stdout

It prints the collectors.keystone config section to use; secrets stay in the 0600 credentials file.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m opsloop.lab.keystone_server",
                                     description="Run a real Keystone (uWSGI, SQLite, fernet) with an nginx S3 "
                                                 "front end on loopback, until Ctrl-C.",
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, help="where config, DB, keys and logs go (default: a temp dir)")
    parser.add_argument("--no-cache", action="store_true", help="run with [cache] enabled = false")
    parser.add_argument("--s3-users", type=int, default=4, help="S3 users with EC2 key pairs (default 4)")
    parser.add_argument("--workers", type=int, default=2, help="uWSGI worker processes (default 2)")
    parser.add_argument("--config-out", type=Path, help="also write the opsloop config section to this file")
    args = parser.parse_args(argv)
    if args.s3_users < 0 or args.workers < 1:
        parser.error("--s3-users must be >= 0 and --workers >= 1")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="opsloop-keystone-"))
    lab = KeystoneLab(workdir, s3_users=args.s3_users, caching=not args.no_cache, workers=args.workers)
    try:
        lab.start()
    except (KeystoneServerError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    assert lab.frontend is not None
    section = {"collectors": {"keystone": {
        "host": "keystone-lab", "url": lab.keystone.url,
        "probes": {"credentials_file": str(lab.credentials_file)},
        "uwsgi_stats": lab.keystone.stats_address, "uwsgi_access_log": str(lab.keystone.access_log),
        "frontend": {"access_logs": [str(lab.frontend.access_log)]}}}}
    text = yaml.safe_dump(section, sort_keys=False)
    if args.config_out:
        args.config_out.write_text(text)
    print(f"Keystone {lab.keystone.url} (caching {'off' if args.no_cache else 'on'}, uWSGI pid {lab.keystone.pid}); "
          f"S3 front end {lab.frontend.url}; workdir {workdir}\n{text}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        stop.wait()
    finally:
        lab.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
