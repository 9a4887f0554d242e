"""Parsers for ipmitool's output: DCMI power reading, SDR sensor lists, and failure diagnosis.

All functions are pure (text in, values out) so they can be fuzzed. A parser never raises
anything but :class:`ParseError`, whose message keeps the first bytes of the offending output.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PREVIEW_BYTES = 120


class ParseError(ValueError):
    """Output that does not look like what ipmitool prints. The message quotes its first bytes."""

    def __init__(self, what: str, text: str) -> None:
        super().__init__(f"{what}; output starts with {preview(text)!r}")
        self.what = what


def preview(text: str, limit: int = PREVIEW_BYTES) -> str:
    raw = text.encode("utf-8", "backslashreplace")
    cut = raw[:limit].decode("utf-8", "ignore")
    return cut + ("..." if len(raw) > limit else "")


# --- DCMI power reading -------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class DcmiReading:
    watts: int
    minimum: int | None
    maximum: int | None
    average: int | None
    sample_period_s: int | None
    active: bool  # "Power reading state is: activated"


# ipmitool 1.8.19 forgets the newline after the timestamp, so "Sampling period" can share a line
# with it: the patterns are searched anywhere, not anchored at line starts.
_DCMI_FIELDS = {
    "watts": re.compile(r"Instantaneous power reading:\s*(\d+)\s*Watts"),
    "minimum": re.compile(r"Minimum during sampling period:\s*(\d+)\s*Watts"),
    "maximum": re.compile(r"Maximum during sampling period:\s*(\d+)\s*Watts"),
    "average": re.compile(r"Average power reading over sample period:\s*(\d+)\s*Watts"),
    "sample_period_s": re.compile(r"Sampling period:\s*(\d+)\s*Seconds"),
}
_DCMI_STATE = re.compile(r"Power reading state is:\s*(activated|deactivated)")


def parse_dcmi_power(text: str) -> DcmiReading:
    """Parse ``ipmitool dcmi power reading``. Instantaneous power and state are required."""
    values: dict[str, int | None] = {}
    for key, pattern in _DCMI_FIELDS.items():
        found = pattern.findall(text)
        if len(found) > 1:
            raise ParseError(f"DCMI output has {len(found)} '{key}' lines, expected one", text)
        values[key] = int(found[0]) if found else None
    state = _DCMI_STATE.findall(text)
    if values["watts"] is None:
        raise ParseError("no 'Instantaneous power reading' in DCMI output", text)
    if len(state) != 1:
        raise ParseError("no single 'Power reading state' in DCMI output", text)
    watts = values.pop("watts")
    assert watts is not None
    return DcmiReading(watts=watts, active=state[0] == "activated", **values)  # type: ignore[arg-type]


# --- SDR sensors ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class SdrSensor:
    name: str
    value: float | None  # None: no reading
    unit: str            # "Watts", "degrees C"; "" when there is no reading
    status: str          # ok, ns, cr, nc, nr, lnc ...
    entity: str = ""     # "10.1"
    sensor_type: str = ""  # "Current", "Power Supply", "Other Units-based Sensor"


_VERBOSE_COLUMNS = 18  # name,value,unit,status,entity,entity name,type,3 nominal,6 thresholds,min,max
_BASIC_COLUMNS = 4     # name,value,unit,status
_FLOAT = re.compile(r"^-?\d+(?:\.\d+)?$")


def parse_sdr_csv(text: str) -> list[SdrSensor]:
    """Parse ``ipmitool -c [-v] sdr elist full``.

    With -v each row has 18 columns (entity and sensor type included), without it 4. ipmitool
    does not quote, so a sensor name containing commas is rebuilt from the surplus left columns.
    Any row that fits neither shape makes the whole output a ParseError: a BMC that answers
    with something else must be noticed, not read as "no sensors".
    """
    sensors: list[SdrSensor] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split(",")
        if len(parts) >= _VERBOSE_COLUMNS:
            cut = len(parts) - _VERBOSE_COLUMNS + 1
            name, rest = ",".join(parts[:cut]), parts[cut:]
            value_s, unit, status, entity, _entity_name, sensor_type = (p.strip() for p in rest[:6])
        elif len(parts) == _BASIC_COLUMNS:
            name, value_s, unit, status = (p.strip() for p in parts)
            entity = sensor_type = ""
        else:
            raise ParseError(f"SDR line {line[:60]!r} has {len(parts)} columns, expected "
                             f"{_BASIC_COLUMNS} or {_VERBOSE_COLUMNS}", text)
        name = name.strip()
        if not name:
            raise ParseError(f"SDR line {line[:60]!r} has no sensor name", text)
        value: float | None = None
        is_watts = unit.strip().lower() == "watts"
        if _FLOAT.match(value_s.strip()):
            value = float(value_s)
            # A drawn power is never negative: ipmitool printed a garbled (sign-converted) raw reading.
            if is_watts and value < 0:
                raise ParseError(f"SDR sensor {name[:40]!r} reads {value_s.strip()[:20]} Watts, a negative power "
                                 f"(garbled reading?)", text)
        elif value_s.strip() and is_watts:
            raise ParseError(f"SDR sensor {name[:40]!r} has reading {value_s[:20]!r}, not a number", text)
        sensors.append(SdrSensor(name=name, value=value, unit=unit.strip() if value is not None else "",
                                 status=status, entity=entity, sensor_type=sensor_type))
    return sensors


_POWERISH = re.compile(r"pwr|power|watt", re.IGNORECASE)
_TOTALISH = re.compile(r"consum|total|system|sys\b|input power|pwr meter|power meter", re.IGNORECASE)
# "PSU1 Input Power", "PS2 Power In", "PSU 1 Pwr": one supply's share, never the host's total by itself.
_PER_PSU = re.compile(r"\bPSU?\s*\d+", re.IGNORECASE)


def power_sensors(sensors: list[SdrSensor], preferred: str | None = None) -> list[SdrSensor]:
    """The sensors that measure power: unit Watts, or a power-named (or Power Supply typed)
    sensor without a reading (ipmitool prints no unit when there is no reading)."""
    out = []
    for s in sensors:
        if s.value is not None and s.unit.lower() == "watts":
            out.append(s)
        elif s.value is None and (s.name == preferred or _POWERISH.search(s.name) or s.sensor_type == "Power Supply"):
            out.append(s)
    return out


def pick_total(sensors: list[SdrSensor], preferred: str | None = None) -> tuple[str, float] | None:
    """Choose the host's total draw from its power sensors (those with a reading).

    Order: the configured sensor; a sensor named like a total ("Pwr Consumption", "Total Power") that
    is not numbered after a supply; the only one; else the sum of all (BMCs that only report
    per-PSU input power: "PSU1 Input Power" + "PSU2 Input Power").
    Returns (sensor label, watts) or None when no power sensor has a reading.
    """
    read = [s for s in sensors if s.value is not None]
    if preferred is not None:
        chosen = [s for s in read if s.name == preferred]
        return (chosen[0].name, chosen[0].value) if chosen else None  # type: ignore[return-value]
    if not read:
        return None
    totals = [s for s in read if _TOTALISH.search(s.name) and not _PER_PSU.search(s.name)]
    if totals:
        return totals[0].name, totals[0].value  # type: ignore[return-value]
    if len(read) == 1:
        return read[0].name, read[0].value  # type: ignore[return-value]
    return f"sum({len(read)})", float(sum(s.value for s in read if s.value is not None))


# --- Failure diagnosis ------------------------------------------------------------------------

_AUTH = re.compile(
    r"RAKP \d HMAC is invalid|unauthorized name|invalid user ?name|password|"
    r"insufficient privilege|Authentication type .* not supported|"
    r"invalid authentication algorithm|invalid integrity algorithm|invalid confidentiality algorithm|"
    r"no matching cipher suite|Invalid session|RAKP \d message indicates an error",
    re.IGNORECASE,
)
_UNREACHABLE = re.compile(
    r"Get Auth Capabilities error|Get Channel Authentication Capabilities|No response from remote|"
    r"Address lookup for .* failed|Connection refused|Network is unreachable|No route to host|"
    r"Unable to establish IPMI v2|Unable to establish LAN session|"
    r"Insufficient resources for session|Session timeout",
    re.IGNORECASE,
)
_UNSUPPORTED = re.compile(
    r"Invalid command \(c1\)|\(c1\)|Command not supported in present state|\(d5\)|"
    r"Invalid data field in request \(cc\)|Requested sensor, data, or record not found|"
    r"Destination unavailable|\(c9\)|not supported",
    re.IGNORECASE,
)


def classify_failure(stdout: str, stderr: str, returncode: int) -> tuple[str, str]:
    """Map a failed ipmitool run to (error kind, message). Session problems are checked first:
    a wrong password also ends in "Unable to establish IPMI v2", so auth markers win."""
    text = _without_noise(f"{stderr}\n{stdout}")
    detail = _detail_line(text)
    if _AUTH.search(text):
        if re.search(r"insufficient privilege", text, re.IGNORECASE):
            return "auth", f"BMC user lacks the privilege for this command ({detail})"
        if re.search(r"invalid (authentication|integrity|confidentiality) algorithm|cipher", text, re.IGNORECASE):
            return "auth", f"BMC rejected the cipher suite ({detail})"
        return "auth", f"authentication failed: wrong user name or password ({detail})"
    if _UNSUPPORTED.search(text):
        return "unsupported", f"command not supported by the BMC ({detail})"
    if _UNREACHABLE.search(text):
        return "unreachable", f"BMC did not answer ({detail})"
    return "tool", f"ipmitool exited with {returncode}: {preview(text.strip())!r}"


# Lines ipmitool -v prints on every run; they say nothing about what went wrong.
_NOISE = re.compile(r"^(Loading IANA PEN Registry|Running Get VSO Capabilities|Discovered IPMB address|"
                    r"Invalid completion code received: Invalid command|Get HPM\.x Capabilities)")


def _without_noise(text: str) -> str:
    lines = [ln.strip().lstrip(">").strip() for ln in text.splitlines()]
    return "\n".join(ln for ln in lines if ln and not _NOISE.match(ln))


def _detail_line(text: str) -> str:
    return "; ".join(text.splitlines()[:2])[:200] or "no diagnostic output"
