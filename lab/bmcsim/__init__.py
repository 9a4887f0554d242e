"""Simulated BMCs (OpenIPMI ipmi_sim + a DCMI extension) for the IPMI collector's tests and bench."""

from opsloop.lab.bmcsim.fleet import (BMCFleet, BMCSpec, SimulatedBMC, SimulatorError, ensure_extension,
                                      reserve_udp_ports)

__all__ = ["BMCFleet", "BMCSpec", "SimulatedBMC", "SimulatorError", "ensure_extension", "reserve_udp_ports"]
