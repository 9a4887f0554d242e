"""``python -m opsloop.controllers.edge.service run ...`` (same as ``opsloop edge run``)."""

import sys

from opsloop.controllers.edge.service.app import main

sys.exit(main())
