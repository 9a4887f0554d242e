"""Load-balancer weight actuators: apply the edge controller's ``EdgeWeights`` decisions safely.

* :mod:`.mapping`: shares -> integer weights (HAProxy 0..256, IPVS 0..65535), largest remainder;
* :mod:`.safety`: bounded step, release of DOWN origins, shadow difference (pure functions);
* :mod:`.base`: the ``Target`` (a load balancer we read/write) and ``Actuator`` protocols;
* :mod:`.haproxy`, :mod:`.lvs`: the two targets (runtime API, ipvsadm);
* :mod:`.store`: versioned history of applied weights on disk (idempotence, rollback);
* :mod:`.applier`: ``EdgeActuator``, every safety rule around one target;
* :mod:`.service`: the Kafka consumer of ``edge.weights`` (``opsloop weights run``);
* :mod:`.config`: the ``controllers.actuator`` config section.
"""
