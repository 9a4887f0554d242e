"""Clients of the load balancers the pipeline reads and drives, shared by the collectors (rates) and the
weight actuators (pushes): :mod:`opsloop.lb.haproxy` (the runtime API socket: ``show stat``, weights) and
:mod:`opsloop.lb.ipvs` (``/proc/net/ip_vs``, ``ip_vs_stats`` and ``ipvsadm -Ln`` listings)."""
