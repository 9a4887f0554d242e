"""The LVS actuator's config takes the reals of an all-port service (``ipvsadm -A -t VIP:0 -p``: a real added
without a port is listed ``ADDR:0``), as the shared parser reads such listings; before, the actuator refused
``ADDR:0`` for every service but a firewall-mark one, so an all-port edge could not be driven."""

from __future__ import annotations

import pytest

from opsloop.controllers.actuators.config import parse_real, parse_service


@pytest.mark.parametrize(("service", "real", "family"), [
    ("tcp:10.0.0.1:0", "10.0.1.2:0", "inet"),
    ("tcp:[2001:db8::1]:0", "[2001:db8::2]:0", "inet6"),
    ("fwm:7", "10.0.1.2:0", "inet"),
    ("fwm6:7", "[2001:db8::2]:0", "inet6"),
])
def test_a_port_0_real_of_an_all_port_or_mark_service_is_taken(service: str, real: str, family: str) -> None:
    key = parse_real(real, parse_service(service))
    assert (key.port, key.family) == (0, family)


def test_a_port_0_real_of_a_one_port_service_is_refused() -> None:
    with pytest.raises(ValueError, match="10.0.1.2:0"):
        parse_real("10.0.1.2:0", parse_service("tcp:10.0.0.1:80"))


def test_an_ipv6_scope_id_is_still_refused() -> None:
    with pytest.raises(ValueError, match="scope"):
        parse_real("[fe80::2%eth0]:0", parse_service("tcp:[2001:db8::1]:0"))
