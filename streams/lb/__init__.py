"""Load-balancer request rates (signal 5): HAProxy and LVS/IPVS counters → per-second rates."""
