"""Power detector: energy, cost per usable TB-year, deviation from the generation, idle servers.

"(Ceph) storage (server) power usage" (docs/sources.md): Gen 1/2/3 servers drew 248/205/155 W under light
load; Gen 1/2 carry 12 x 4 TB (48 TB raw), Gen 3 12 x 8 TB (96 TB raw). At 0.15 EUR/kWh, disks filled
to 70 % and 3x replication the power cost of a usable TB-year is EUR 29.10 / 24.05 / 9.09, halved
with erasure coding 2+1. An idle Gen 3 box drew 136 W (82 W with its disks in standby).

    cost per usable TB-year = watts * 8760 h / 1000 * price / (raw_TB * fill * efficiency)
    efficiency = 1 / replicas, or k / (k + m) for an erasure-code profile k+m

Per server the detector keeps a smoothed mean (EWMA) of the watts it reads (``ipmi_power{host}`` field
``watts``, or ``avg_watts``), and its inventory entry (``ServerSpec``: generation, raw TB,
protection, fill ratio, in service or not; moved to another generation, its findings of the old one clear).
Findings:

* ``power.cost`` (info): energy per year and cost per usable TB-year of each server, the published table;
* ``power.generation_deviation`` (warning): a server whose mean draw deviates from the median of its
  generation by more than ``deviation_ratio`` (needs ``min_generation_size`` servers; cleared when its server
  is no longer compared: out of service, or too few left). The generation is the servers this detector reads:
  readings that carry their generation are keyed by it (``opsloop.topics.TOPIC_KEY_TAGS``), so with several
  stream workers one reads all of it; a reading without it (its generation only in the detector's settings)
  is keyed by host and compared with its worker's share. The explanation says of how many servers;
* ``power.idle_candidate`` (info): a server not in service (or with utilisation below
  ``idle_utilisation``) that still draws power: a candidate for powering down, with the yearly saving.

Input adapters: ``power_reading`` reads ``ipmi_power{host}`` field ``watts`` (``collectors/ipmi``: the
DCMI reading or the SDR total) and Telegraf's ``ipmi_sensor{name, unit=watts}`` field ``value`` for
total-power sensor names (``pwr_consumption``, ``instantaneous_power_reading``, ``system_power`` ...; not per-PSU sensors); ``spec_from_tags`` builds the inventory entry from the collector's metadata tags
(``generation``, ``raw_capacity_tb``) when the host is not configured. For the stream agent the state
splits per host (``state_of``/``restore_part``).
"""

from __future__ import annotations

import re
import statistics
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from opsloop.records import Finding, Severity
from opsloop.records import Metric

from opsloop.streams.detectors.findingbook import FindingBook, where_key
from opsloop.streams.detectors.state_check import StateError, count, flag, get, items, obj, real, text

HOURS_PER_YEAR = 8760.0
COST = "power.cost"
DEVIATION = "power.generation_deviation"
IDLE = "power.idle_candidate"
RUNBOOK = "runbooks/power.md"
# The largest draw one host's reading may report: a 4U GPU server draws ~10 kW. Beyond it (1e308 W is
# valid on the wire) it is a corrupt reading: refused, or one such reading kept the host's mean at
# 1e262 W for thousands of readings, and as its first reading made its yearly cost inf.
MAX_HOST_WATTS = 1e5
# The largest raw capacity an inventory entry may claim (a 1 EB server is a damaged state, or a corrupt tag:
# refused at ingest and in the settings too).
MAX_RAW_TB = 1e6
_EC = re.compile(r"^ec:(\d+)\+(\d+)$")
_REPLICA = re.compile(r"^replica:(\d+)$")


def protection_efficiency(protection: str) -> float:
    """Usable share of raw capacity: 'replica:3' -> 1/3, 'ec:2+1' -> 2/3."""
    p = protection.strip().lower()
    m = _REPLICA.match(p)
    if m and int(m.group(1)) >= 1:
        return 1.0 / int(m.group(1))
    m = _EC.match(p)
    if m and int(m.group(1)) >= 1:
        k, mm = int(m.group(1)), int(m.group(2))
        return k / (k + mm)
    raise ValueError(f"protection {protection!r}: expected 'replica:N' (N >= 1) or 'ec:K+M' (K >= 1)")


def energy_kwh_per_year(watts: float) -> float:
    return watts * HOURS_PER_YEAR / 1000.0


def cost_per_usable_tb_year(watts: float, raw_tb: float, protection: str, fill_ratio: float,
                            eur_per_kwh: float) -> float:
    usable = raw_tb * fill_ratio * protection_efficiency(protection)
    if usable <= 0:
        raise ValueError(f"usable capacity is {usable} TB (raw {raw_tb}, fill {fill_ratio}): must be > 0")
    return energy_kwh_per_year(watts) * eur_per_kwh / usable


@dataclass(frozen=True, slots=True)
class ServerSpec:
    host: str
    generation: str
    raw_tb: float
    protection: str = "replica:3"
    fill_ratio: float = 0.7
    in_service: bool = True

    def __post_init__(self) -> None:
        protection_efficiency(self.protection)
        if not 0.0 < self.fill_ratio <= 1.0:
            raise ValueError(f"{self.host}: fill_ratio {self.fill_ratio} must be in (0, 1]")
        if self.raw_tb <= 0:
            raise ValueError(f"{self.host}: raw_tb {self.raw_tb} must be > 0")


_SPEC_FIELDS = tuple(f.name for f in fields(ServerSpec))


class PowerDetector:
    def __init__(self, inventory: list[ServerSpec], eur_per_kwh: float = 0.15, deviation_ratio: float = 0.15,
                 min_generation_size: int = 3, idle_utilisation: float = 0.05, min_samples: int = 3,
                 smoothing: float = 0.05, *, book: FindingBook | None = None) -> None:
        self.inventory = {s.host: s for s in inventory}
        self.eur_per_kwh = eur_per_kwh
        self.deviation_ratio = deviation_ratio
        self.min_generation_size = min_generation_size
        self.idle_utilisation = idle_utilisation
        self.min_samples = min_samples
        self.smoothing = smoothing
        self.sums: dict[str, list[float]] = {}          # host -> [mean watts, samples]
        self.utilisation: dict[str, float] = {}
        self.book = book if book is not None else FindingBook()   # the handler's, with its refresh
        self.deviation_work = 0   # servers compared so far (what a test counts instead of timing)

    def mean_watts(self, host: str) -> float | None:
        s = self.sums.get(host)
        return s[0] if s and s[1] else None

    def update(self, sample: Metric | Mapping[str, Any], deviation: bool = True) -> list[Finding]:
        """One power reading: Metric ipmi_power{host} watts, or {"host", "watts", "timestamp"[, "utilisation"]}.

        ``deviation=False`` leaves the generation comparison to one :meth:`deviation` call per
        generation and batch: per sample it costs the generation's size (quadratic per round)."""
        if isinstance(sample, Metric):
            doc: dict[str, Any] = {**sample.tags, **sample.fields, "timestamp": sample.timestamp}
        else:
            doc = dict(sample)
        host = str(doc.get("host", ""))
        watts = doc.get("watts", doc.get("avg_watts"))
        if not host or isinstance(watts, bool) or not isinstance(watts, (int, float)) \
                or not 0 <= watts <= MAX_HOST_WATTS:   # also refuses nan
            raise ValueError(f"power sample needs host and watts in [0, {MAX_HOST_WATTS:g}] (got {doc!r:.200})")
        now = float(doc.get("timestamp", 0.0))
        s = self.sums.setdefault(host, [0.0, 0])
        s[1] += 1
        # Mean of the first samples, then an EWMA so that a lasting change shows within ~1/smoothing reads.
        s[0] += max(self.smoothing, 1.0 / s[1]) * (float(watts) - s[0])
        if "utilisation" in doc:
            self.utilisation[host] = float(doc["utilisation"])
        spec = self.inventory.get(host)
        if spec is None or s[1] < self.min_samples:
            return []
        out = self._cost(spec, now) + self._idle(spec, now)
        return out + self.deviation(spec.generation, now) if deviation else out

    def cost_row(self, spec: ServerSpec, watts: float) -> dict[str, Any]:
        energy = energy_kwh_per_year(watts)
        return {"host": spec.host, "generation": spec.generation, "watts": watts,
                "kwh_per_year": energy, "eur_per_year": energy * self.eur_per_kwh,
                "eur_per_usable_tb_year": cost_per_usable_tb_year(
                    watts, spec.raw_tb, spec.protection, spec.fill_ratio, self.eur_per_kwh)}

    def cost_table(self) -> list[dict[str, Any]]:
        rows = []
        for host, spec in sorted(self.inventory.items()):
            w = self.mean_watts(host)
            if w is not None:
                rows.append(self.cost_row(spec, w))
        return rows

    def _cost(self, spec: ServerSpec, now: float) -> list[Finding]:
        w = self.mean_watts(spec.host)
        assert w is not None
        row = self.cost_row(spec, w)
        return [self.book.raise_(
            detector=COST, what="power cost per usable TB-year", where={"host": spec.host, "generation": spec.generation},
            observed=round(row["eur_per_usable_tb_year"], 2), expected=None, score=0.0, severity=Severity.INFO,
            explanation=(f"{w:.0f} W -> {row['kwh_per_year']:.0f} kWh/year, EUR {row['eur_per_year']:.2f}/year at "
                         f"{self.eur_per_kwh} EUR/kWh; {spec.raw_tb:g} TB raw, {spec.protection}, "
                         f"{spec.fill_ratio:.0%} fill -> EUR {row['eur_per_usable_tb_year']:.2f} per usable TB-year"),
            now=now, runbook=RUNBOOK)]

    def _idle(self, spec: ServerSpec, now: float) -> list[Finding]:
        where = {"host": spec.host, "generation": spec.generation}
        util = self.utilisation.get(spec.host)
        idle = (not spec.in_service) or (util is not None and util < self.idle_utilisation)
        w = self.mean_watts(spec.host) or 0.0
        if idle and w > 0:
            saving = energy_kwh_per_year(w) * self.eur_per_kwh
            reason = "not in service" if not spec.in_service else f"utilisation {util:.0%}"
            return [self.book.raise_(
                detector=IDLE, what="idle server: candidate for powering down", where=where,
                observed=round(w, 1), expected=0.0, score=0.3, severity=Severity.INFO,
                explanation=(f"{spec.host} is {reason} yet draws {w:.0f} W: powering it down saves "
                             f"{energy_kwh_per_year(w):.0f} kWh, EUR {saving:.2f} per year (disk standby alone "
                             "saved ~40 % on an idle Gen 3 box in the published measurement: 136 W -> 82 W)"),
                now=now, runbook=RUNBOOK)]
        done = self.book.clear(IDLE, where, now, "in use again")
        return [done] if done else []

    def set_spec(self, spec: ServerSpec, now: float) -> list[Finding]:
        """Take ``spec`` as its host's inventory entry. A host moved to another generation (the config or the
        collector's tag corrected) has its findings about the old one cleared at ``now``: their ``where`` names
        the old generation, so nothing else ever refreshed or cleared them (a deviation page open for good)."""
        old = self.inventory.get(spec.host)
        self.inventory[spec.host] = spec
        if old is None or old.generation == spec.generation or not self.book.open:
            return []
        where = {"host": spec.host, "generation": old.generation}
        why = f"{spec.host} is now of generation {spec.generation}, no longer of {old.generation}"
        return [f for d in (COST, IDLE, DEVIATION) if (f := self.book.clear(d, where, now, why)) is not None]

    def deviation(self, generation: str, now: float) -> list[Finding]:
        """Compare every in-service server of ``generation`` with the generation's median draw.

        A deviation of a server no longer compared (taken out of service, moved to another generation, or
        its generation now too small to have a median) is cleared: left open, nothing else cleared it."""
        hosts = [h for h, s in self.inventory.items() if s.generation == generation and s.in_service
                 and self.sums.get(h, [0, 0])[1] >= self.min_samples]
        self.deviation_work += len(hosts)
        out: list[Finding] = []
        keep: set[str] = set()
        if len(hosts) >= self.min_generation_size:
            means = {h: self.mean_watts(h) or 0.0 for h in hosts}
            norm = statistics.median(means.values())
            for h, w in means.items():
                where = {"host": h, "generation": generation}
                dev = (w - norm) / norm if norm > 0 else 0.0
                if abs(dev) > self.deviation_ratio:
                    out.append(self.book.raise_(
                        detector=DEVIATION, what="power draw deviates from its generation", where=where,
                        observed=round(w, 1), expected=round(norm, 1),
                        score=min(1.0, abs(dev) / (3 * self.deviation_ratio)), severity=Severity.WARNING,
                        # how many servers the median is of: with N stream workers, readings without their
                        # generation (keyed by host) are compared only with their worker's share
                        explanation=(f"{h} draws {w:.0f} W, {dev:+.0%} against the {generation} median {norm:.0f} W "
                                     f"of the {len(means)} servers compared (tolerance {self.deviation_ratio:.0%})"),
                        now=now, runbook=RUNBOOK))
                    keep.add(where_key(DEVIATION, where))
                else:
                    done = self.book.clear(DEVIATION, where, now, "back in line with its generation")
                    if done:
                        out.append(done)
            why = f"no longer compared: not an in-service server of {generation} with a reading"
        else:
            why = (f"no longer compared: fewer than {self.min_generation_size} in-service servers of {generation} "
                   "to take a median of")
        if self.book.open:
            out += self.book.clear_all_except(DEVIATION, keep, now, why, match={"generation": generation})
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"inventory": [asdict(s) for s in self.inventory.values()],
                "config": {"eur_per_kwh": self.eur_per_kwh, "deviation_ratio": self.deviation_ratio,
                           "min_generation_size": self.min_generation_size,
                           "idle_utilisation": self.idle_utilisation, "min_samples": self.min_samples,
                           "smoothing": self.smoothing},
                "sums": self.sums, "utilisation": self.utilisation, "book": self.book.to_dict()}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> "PowerDetector":
        det = cls([ServerSpec(**s) for s in doc.get("inventory", [])], **doc.get("config", {}),
                  book=FindingBook.from_dict(doc.get("book", {})))
        det.sums = {h: [float(v[0]), int(v[1])] for h, v in doc.get("sums", {}).items()}
        det.utilisation = {h: float(v) for h, v in doc.get("utilisation", {}).items()}
        return det

    # --------------------------------------------------------------------- per-host state parts
    def state_of(self, host: str) -> dict[str, Any] | None:
        spec = self.inventory.get(host)
        book = self.book.split("host").get(host, FindingBook())
        if spec is None and host not in self.sums and not book.open:
            return None
        # a flat dataclass of atomic values: a shallow copy is what asdict() gives, without its deep copies
        return {"spec": {f: getattr(spec, f) for f in _SPEC_FIELDS} if spec else None, "sums": self.sums.get(host),
                "utilisation": self.utilisation.get(host), "book": book.to_dict()}

    def forget(self, host: str) -> None:
        """Drop everything known about ``host`` (its open findings are the caller's to clear first)."""
        self.inventory.pop(host, None)
        self.sums.pop(host, None)
        self.utilisation.pop(host, None)

    def restore_part(self, host: str, doc: Mapping[str, Any]) -> None:
        """Take back a part :meth:`state_of` wrote, every field checked first (StateError naming it: nothing
        of the part is taken then). Before, a damaged one loaded: a negative sample count divided by zero at
        the host's next reading, a protection that was no string raised at every cost, 1e308 W went into
        the generation's median (every deviation finding of it absurd)."""
        spec = None if doc.get("spec") is None else _stored_spec(doc["spec"], host)
        sums = None
        if doc.get("sums") is not None:
            mean, n = items(doc["sums"], "sums", length=2)
            sums = [real(mean, "sums[0]", 0.0, MAX_HOST_WATTS), count(n, "sums[1]")]
        util = None if doc.get("utilisation") is None else real(doc["utilisation"], "utilisation", 0.0, 1.0)
        book = FindingBook.from_dict(doc.get("book", {}), self.book.refresh_s)
        book.check_about({"host": host})
        if spec is not None:
            self.inventory[host] = spec
        if sums is not None:
            self.sums[host] = sums
        if util is not None:
            self.utilisation[host] = util
        self.book.merge(book)


def _stored_spec(doc: Any, host: str) -> ServerSpec:
    """An inventory entry as :meth:`PowerDetector.state_of` wrote it for ``host``, or StateError naming the field."""
    doc = obj(doc, "spec")
    unknown = sorted(set(doc) - set(_SPEC_FIELDS))
    if unknown:
        raise StateError(f"spec.{unknown[0]}", "not a field of an inventory entry")
    if text(get(doc, "host", "spec"), "spec.host") != host:
        raise StateError("spec.host", f"{doc['host']!r:.60} in the state of {host!r:.60}")
    generation = text(get(doc, "generation", "spec"), "spec.generation")
    if not generation:
        raise StateError("spec.generation", "empty")
    raw_tb = real(get(doc, "raw_tb", "spec"), "spec.raw_tb", 0.0, MAX_RAW_TB, above=True)
    protection = text(doc.get("protection", "replica:3"), "spec.protection")
    fill = real(doc.get("fill_ratio", 0.7), "spec.fill_ratio", 0.0, 1.0, above=True)
    in_service = flag(doc.get("in_service", True), "spec.in_service")
    try:
        return ServerSpec(host, generation, raw_tb, protection, fill, in_service)
    except ValueError as e:
        raise StateError("spec.protection", str(e)) from None


POWER_METRICS = frozenset({"ipmi_power", "ipmi_sensor"})
# Telegraf's SDR sensor names (lower case, underscores) that hold the *server's total* draw; per-PSU
# sensors ("ps1_input_power") are left out so that they do not mix into the server's mean.
_TOTAL_POWER_SENSOR = re.compile(r"^(instantaneous_power_reading|(sys(tem)?_|total_)?(pwr|power)_?"
                                 r"(consumption|meter|usage)?|total_power|sys(tem)?_power)$")


def power_reading(m: Metric) -> tuple[str, float] | None:
    """(host, watts) from a total-power sample, None for samples that are not one.

    Raises ValueError for a power sample whose watts are missing or not a number in [0, MAX_HOST_WATTS].
    """
    if m.name == "ipmi_power":
        host, value = m.tags.get("host", ""), m.fields.get("watts")
    elif m.name == "ipmi_sensor":   # Telegraf inputs.ipmi_sensor: one sample per SDR sensor
        sensor = m.tags.get("name", "").lower().replace(" ", "_")
        if m.tags.get("unit", "").lower() != "watts" or not _TOTAL_POWER_SENSOR.match(sensor):
            return None
        host, value = m.tags.get("host") or m.tags.get("server", ""), m.fields.get("value")
    else:
        return None
    if not host or isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{m.name}: needs a host tag and a number >= 0 as watts "
                         f"(got host={host!r:.100}, watts={value!r:.100})")
    if not 0 <= value <= MAX_HOST_WATTS:   # also refuses nan
        raise ValueError(f"{m.name}: watts {value!r:.100} of host {host!r:.100} is not a plausible reading "
                         f"(expected 0 to {MAX_HOST_WATTS:g} W per host)")
    return host, float(value)


def spec_from_tags(host: str, tags: Mapping[str, str], protection: str, fill_ratio: float) -> ServerSpec | None:
    """The inventory entry from the collector's metadata tags, or None if they do not say enough.

    Raises ValueError for a ``raw_capacity_tb`` beyond ``MAX_RAW_TB`` (inf included): taken, it was stored and
    refused by every restore (:func:`_stored_spec`), so the host started afresh at each restart."""
    generation = tags.get("generation")
    try:
        raw_tb = float(tags.get("raw_capacity_tb", ""))
    except ValueError:
        return None
    if raw_tb > MAX_RAW_TB:
        raise ValueError(f"raw_capacity_tb {tags['raw_capacity_tb']!r:.60} of host {host!r:.100} is no server's "
                         f"raw capacity (expected at most {MAX_RAW_TB:g} TB)")
    if not generation or not raw_tb > 0:   # also refuses nan
        return None
    return ServerSpec(host=host, generation=generation, raw_tb=raw_tb, protection=protection, fill_ratio=fill_ratio)
