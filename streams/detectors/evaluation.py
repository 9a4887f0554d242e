"""Event-level precision, recall and detection delay of scores against labeled windows.

An alarm is a maximal run of rows whose score is >= ``threshold`` (runs separated by fewer than
``merge_gap`` rows are one alarm). A labeled window counts as detected if an alarm starts or is
active within it; the delay is the number of rows (and seconds) from the window's first row to the
first alarming row. An alarm that touches no window is a false positive. Rows inside the warm-up
are ignored, as NAB ignores its probationary period.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EventScore:
    windows: int
    detected: int
    false_positives: int
    delays_rows: list[int]
    delays_s: list[float]
    alarm_rows: int
    rows: int

    @property
    def precision(self) -> float:
        alarms = self.detected + self.false_positives
        return self.detected / alarms if alarms else 1.0

    @property
    def recall(self) -> float:
        return self.detected / self.windows if self.windows else 1.0

    @property
    def mean_delay_s(self) -> float:
        return sum(self.delays_s) / len(self.delays_s) if self.delays_s else 0.0

    @property
    def false_alarm_rate(self) -> float:
        """Alarming rows outside any window, per row (the normal-data false positive rate)."""
        return self.false_positives / self.rows if self.rows else 0.0


def alarms(scores: list[float], threshold: float, merge_gap: int = 3, start: int = 0) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for i in range(start, len(scores)):
        if scores[i] >= threshold:
            if runs and i - runs[-1][1] <= merge_gap:
                runs[-1] = (runs[-1][0], i)
            else:
                runs.append((i, i))
    return runs


def evaluate(scores: list[float], timestamps: list[float], windows: list[tuple[int, int]],
             threshold: float = 0.5, warmup_rows: int = 0) -> EventScore:
    runs = alarms(scores, threshold, start=warmup_rows)
    flagged = [False] * len(scores)
    for a, b in runs:
        for i in range(a, b + 1):
            flagged[i] = scores[i] >= threshold
    detected, delays_rows, delays_s = 0, [], []
    for a, b in windows:
        hit = next((i for i in range(a, b + 1) if flagged[i]), None)
        if hit is not None:
            detected += 1
            delays_rows.append(hit - a)
            delays_s.append(timestamps[hit] - timestamps[a])
    # rows inside some window, as a prefix sum: an alarm touches a window if it holds one of them (comparing
    # every alarm with every window was quadratic: a 10^5-row file of alternating labels ran for an hour)
    cover = [0] * (len(scores) + 1)
    for a, b in windows:
        cover[a] += 1
        cover[b + 1] -= 1
    inside = [0] * (len(scores) + 1)
    depth = 0
    for i in range(len(scores)):
        depth += cover[i]
        inside[i + 1] = inside[i] + (depth > 0)
    fp = sum(1 for a, b in runs if inside[b + 1] == inside[a])
    return EventScore(windows=len(windows), detected=detected, false_positives=fp, delays_rows=delays_rows,
                      delays_s=delays_s, alarm_rows=sum(flagged), rows=len(scores) - warmup_rows)
