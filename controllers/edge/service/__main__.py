"""``python -m controllers.edge.service run ...`` (same as ``opsloop edge run``)."""

import sys

from controllers.edge.service import main

sys.exit(main())
