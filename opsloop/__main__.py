"""``python -m opsloop ...``: the same as the ``opsloop`` command (useful from a checkout without the script)."""

import sys

from opsloop.cli import main

sys.exit(main())
