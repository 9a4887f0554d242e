"""``python -m opsloop.collectors.netperf``: see collectors/netperf/cli.py."""

import sys

from opsloop.collectors.netperf.cli import main

sys.exit(main())
