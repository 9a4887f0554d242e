"""bench_detect's window-score rows: opsloop beside the same-run baselines on the corpora we can see."""

from __future__ import annotations

from bench import bench_detect
from opsloop.streams.detectors.evaluate_corpora import SKAB_ENV


def test_window_scores_beat_the_same_run_baselines(monkeypatch) -> None:
    monkeypatch.delenv(SKAB_ENV, raising=False)
    rows = bench_detect._window_scores(quick=True)
    assert rows[0]["metric"] == "not run" and SKAB_ENV in rows[0]["value"]     # SKAB says how to enable it
    scored = rows[1:]
    assert {r["benchmark"] for r in scored} == {"anomaly.window_score.ops", "anomaly.window_score.synthetic",
                                                 "anomaly.window_score.scenarios"}
    assert {r["baseline"] for r in scored} == {"rolling z-score (500)", "river HalfSpaceTrees"}
    assert {r["metric"] for r in scored} == {"standard", "reward_low_fp", "reward_low_fn"}
    for r in scored:
        assert 0.0 <= r["baseline_value"] <= 100.0
        assert r["ok"] is True, r


def test_skab_rows_when_the_directory_is_given(tmp_path) -> None:
    """A two-experiment SKAB-shaped directory (the layout of its README): the corpus loads and is scored."""
    header = ("datetime;Accelerometer1RMS;Accelerometer2RMS;Current;Pressure;Temperature;Thermocouple;"
              "Voltage;Volume Flow RateRMS;anomaly;changepoint")
    for k in range(2):
        d = tmp_path / "data" / "valve1"
        d.mkdir(parents=True, exist_ok=True)
        lines = [header]
        for i in range(600):
            bad = 400 <= i < 480
            v = 1.0 + 0.01 * ((i * 7 + k) % 5) + (2.0 if bad else 0.0)
            lines.append(f"2020-03-09 10:{i // 60:02d}:{i % 60:02d};" + ";".join([f"{v:.4f}"] * 8)
                         + f";{1.0 if bad else 0.0};0.0")
        (d / f"{k}.csv").write_text("\n".join(lines) + "\n")
    corpora = bench_detect.corpora(quick=True, skab=str(tmp_path))
    assert len(corpora["skab"]) == 2 and len(corpora["skab"][0].channels) == 8
    [(name, scores, windows), _] = bench_detect.corpus_scores(corpora["skab"], bench_detect._opsloop_scores)
    assert windows == [(400, 479)] and max(scores[400:405]) >= 0.9 and max(scores[100:400]) < 0.5
