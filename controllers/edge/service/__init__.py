"""The edge control service (`opsloop edge run`): one process that owns the controller's state.

- :mod:`~opsloop.controllers.edge.service.app`        the process: wiring, start/stop, ``opsloop edge`` CLI
- :mod:`~opsloop.controllers.edge.service.loop`       one tick: observation → controller → decisions
- :mod:`~opsloop.controllers.edge.service.inputs`     newest demand per edge from ``edge.demand``
- :mod:`~opsloop.controllers.edge.service.kafka_io`   publish decisions and findings; recover the last ones
- :mod:`~opsloop.controllers.edge.service.store`      the topology in force, changed by the API (audited)
- :mod:`~opsloop.controllers.edge.service.overrides`  API changes kept across restarts
- :mod:`~opsloop.controllers.edge.service.api`        the authenticated topology API
- :mod:`~opsloop.controllers.edge.service.api_token`  the API's bearer token from a 0600 file or the environment
- :mod:`~opsloop.controllers.edge.service.config`     the ``controllers.edge`` section
- :mod:`~opsloop.controllers.edge.service.metrics`    its Prometheus metrics
"""
