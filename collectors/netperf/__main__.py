"""``python -m collectors.netperf``: see collectors/netperf/cli.py."""

import sys

from collectors.netperf.cli import main

sys.exit(main())
