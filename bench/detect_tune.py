"""Tuning harness for the anomaly detector (not a benchmark row): window scores on the TUNING seeds of the
operational corpus, SKAB and the scenarios, with a per-kind breakdown, for one configuration.

examples:
  python -m bench.detect_tune --skab /data/skab
  python -m bench.detect_tune --set z0=3.5 --set refractory=200 --half report
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import time

from opsloop.streams.detectors.anomaly.model import DetectorConfig, StreamingDetector
from opsloop.streams.detectors.evaluate_corpora import load_skab, scenario_corpus, skab_dir, synthetic
from opsloop.streams.detectors.evaluate_windows import all_profiles, window_score
from opsloop.streams.detectors.ops_corpus import REPORT_SEEDS, TUNE_SEEDS, ops_corpus


def scores_of(corpus, cfg):
    out = []
    for s in corpus:
        chans = list(s.channels.values()) or [s.values]
        per = []
        for ch in chans:
            upd = StreamingDetector(cfg).update
            per.append([upd(t, v) for t, v in zip(s.timestamps, ch)])
        out.append((s.name, [max(r) for r in zip(*per)] if len(per) > 1 else per[0], s.windows))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(epilog=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skab")
    ap.add_argument("--half", choices=("tune", "report"), default="tune")
    ap.add_argument("--set", action="append", default=[], help="config field=value")
    ap.add_argument("--corpora", default="ops,skab,synthetic,scenarios")
    ap.add_argument("--kinds", action="store_true", help="per-kind breakdown")
    a = ap.parse_args()
    kw = {}
    types = {f.name: f.type for f in dataclasses.fields(DetectorConfig)}
    for item in a.set:
        k, v = item.split("=", 1)
        kw[k] = int(v) if types[k] in (int, "int") else float(v)
    cfg = DetectorConfig(**kw)
    want = a.corpora.split(",")
    found = {}
    if "ops" in want:
        found["ops"] = ops_corpus(TUNE_SEEDS if a.half == "tune" else REPORT_SEEDS)
    if "skab" in want and skab_dir(a.skab):
        found["skab"] = load_skab(skab_dir(a.skab))
    if "synthetic" in want:
        found["synthetic"] = synthetic()
    if "scenarios" in want:
        found["scenarios"] = scenario_corpus()
    for name, corpus in found.items():
        t0 = time.perf_counter()
        sc = scores_of(corpus, cfg)
        el = time.perf_counter() - t0
        res = all_profiles(sc)
        std = res[0]
        print(f"{name:10s} std {std.score:6.1f} lowfp {res[1].score:6.1f} lowfn {res[2].score:6.1f} "
              f"thr {std.threshold:.3f} det {std.detected}/{std.windows} fp_rows {std.false_alarm_rows} ({el:.1f}s)")
        if a.kinds:
            agg = collections.defaultdict(lambda: [0, 0, 0, 0.0])
            for r in std.per_series:
                k = r.name.split("/")[-1] if name == "ops" else r.name
                g = agg[k]
                g[0] += r.windows; g[1] += r.detected; g[2] += r.false_alarm_rows; g[3] += r.raw
            for k, (w, d, f, raw) in sorted(agg.items()):
                print(f"    {k:22s} det {d:3d}/{w:3d} fp {f:4d} raw {raw:7.2f}")


if __name__ == "__main__":
    main()
