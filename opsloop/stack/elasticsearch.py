"""Elasticsearch 8.19 (single node, loopback, no security) as a managed local process.

The distribution is the integ-test zip from Maven Central (``setup.d/70-elasticsearch.sh``): core
modules only (bulk, search, aggregations, index templates, data streams). Elasticsearch refuses
to run as root, so the process runs as ``nobody`` through ``setpriv``; its config, data, logs and
temp directories live under ``data_dir/elasticsearch`` and are handed to that user. ``data_dir``
must therefore be reachable by ``nobody`` (not under a 0700 directory such as pytest's tmp root).

    es = elasticsearch(Path("/tmp/opsloop-es"), "127.0.0.1", 29200, 29300)
    es.start()          # ready when GET /_cluster/health answers (GET / answers 405 in this build)
    ...
    es.stop()           # by PID, like every ManagedProcess
"""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path

import requests
import yaml

from opsloop.config import REPO_ROOT
from opsloop.stack.process import ManagedProcess, StackError, require_binary

ES_VERSION = "8.19.21"
ES_HOME = REPO_ROOT / ".cache" / "elasticsearch" / f"elasticsearch-{ES_VERSION}"
RUN_AS_USER = "nobody"
RUN_AS_GROUP = "nogroup"


def _java_home() -> str:
    """A Java 17+ home for ES_JAVA_HOME (Elasticsearch ignores JAVA_HOME)."""
    for candidate in (os.environ.get("ES_JAVA_HOME"), os.environ.get("JAVA_HOME"),
                      "/usr/lib/jvm/java-17-openjdk-amd64"):
        if candidate and Path(candidate, "bin", "java").exists():
            return candidate
    java = require_binary("java", "install a Java 17 runtime (make setup)")
    return str(Path(os.path.realpath(java)).parent.parent)


def _reachable_by(path: Path, uid: int) -> bool:
    """True when every ancestor of ``path`` lets ``uid`` (not root, not the owner) traverse it."""
    for parent in [path, *path.parents]:
        if not parent.exists():
            continue
        st = parent.stat()
        if st.st_uid != uid and not st.st_mode & 0o001:
            return False
    return True


def _cluster_health_ok(url: str) -> bool:
    r = requests.get(f"{url}/_cluster/health", timeout=2)
    return r.status_code == 200 and r.json().get("status") in ("green", "yellow")


def elasticsearch(data_dir: Path, host: str, port: int, transport_port: int, heap: str = "512m",
                  es_home: Path = ES_HOME) -> ManagedProcess:
    """Write the node's config under ``data_dir/elasticsearch`` and return it as a ManagedProcess."""
    launcher = es_home / "bin" / "elasticsearch"
    if not launcher.exists():
        raise StackError(f"elasticsearch: distribution missing in {es_home}; run `make setup` "
                         f"(setup.d/70-elasticsearch.sh)")
    setpriv = require_binary("setpriv", "install util-linux (setpriv runs Elasticsearch as an unprivileged user)")
    user = pwd.getpwnam(RUN_AS_USER)
    work = data_dir / "elasticsearch"
    if not _reachable_by(work, user.pw_uid):
        raise StackError(f"elasticsearch: {work} is not reachable by user {RUN_AS_USER!r} (a parent directory is "
                         f"mode 0700?); choose a data dir under a world-traversable directory such as /tmp")
    conf = work / "config"
    for sub in ("config", "data", "logs", "tmp"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    # The distribution's own JVM options and log4j setup; our node settings on top.
    for name in ("jvm.options", "log4j2.properties"):
        shutil.copyfile(es_home / "config" / name, conf / name)
    (conf / "jvm.options.d").mkdir(exist_ok=True)
    settings = {
        "cluster.name": "opsloop",
        "node.name": "opsloop-es",
        "path.data": str(work / "data"),
        "path.logs": str(work / "logs"),
        "network.host": host,
        "http.port": port,
        "transport.port": transport_port,
        "discovery.type": "single-node",
        "xpack.security.enabled": False,
        # Tests fill small disks: do not turn indices read-only at 95 % full.
        "cluster.routing.allocation.disk.threshold_enabled": False,
        "action.destructive_requires_name": False,
    }
    (conf / "elasticsearch.yml").write_text(yaml.safe_dump(settings, sort_keys=False))
    for path in [work, *work.rglob("*")]:
        os.chown(path, user.pw_uid, user.pw_gid)
    env = {
        "ES_JAVA_HOME": _java_home(),
        "ES_JAVA_OPTS": f"-Xms{heap} -Xmx{heap}",
        "ES_PATH_CONF": str(conf),
        "ES_TMPDIR": str(work / "tmp"),
        "HOME": str(work),
    }
    argv = [setpriv, f"--reuid={RUN_AS_USER}", f"--regid={RUN_AS_GROUP}", "--clear-groups", str(launcher)]
    url = f"http://{host}:{port}"
    return ManagedProcess(name="elasticsearch", argv=argv, workdir=work, env=env,
                          ports={"http": (host, port), "transport": (host, transport_port)},
                          ready=lambda: _cluster_health_ok(url), ready_timeout_s=150, stop_timeout_s=30)
