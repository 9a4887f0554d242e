"""Exit statuses of the long-running services, chosen so a service manager can act on them.

``collect``, ``stream worker``, ``edge run``, ``weights run`` and ``page run`` exit :data:`CONFIG` when
their configuration can never work (config or overrides file, Kafka/TLS/SASL settings, a secret file): the
systemd units stop restarting on it (``RestartPreventExitStatus=78``); and :data:`TEMPFAIL` when a start
failed for a reason a later start may not meet (a port taken, a dependency not answering): restarted.
Values from sysexits.h. One-shot commands (``config check``, ``deadletter``, ``weights show``, ``edge
check`` ...) keep 2 for any error, as CLIs conventionally do: nobody restarts them.
"""

from __future__ import annotations

USAGE = 2        # argparse's own: a bad command line
SOFTWARE = 70    # EX_SOFTWARE: the service gave up on itself (a stalled table recovery); restart it
TEMPFAIL = 75    # EX_TEMPFAIL: try again later (a port taken, a broker or dependency not reachable at start)
CONFIG = 78      # EX_CONFIG: the configuration can never work; restarting does not help, do not restart
