"""bench/web_load refuses to run without Redis: each web process would keep its own channel
layer and the owners would see a quarter of the events and none of the producer's (a run on
2026-11-26 read 0 of 40 viewers with every event for that reason alone)."""

from __future__ import annotations

import pytest

from bench import web_load


def test_web_load_without_redis_url_names_it_and_exits_2(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    with pytest.raises(SystemExit) as ended:
        web_load.main(["--people", "1", "--seconds", "1"])
    assert ended.value.code == 2
    assert "REDIS_URL is not set" in capsys.readouterr().err


def test_the_after_the_ramp_figures_hold_only_requests_sent_after_it() -> None:
    tally = web_load.Tally()
    tally.record("GET queue", "200", 5.0, sent=1.0)  # during the ramp: the whole run's figures only
    tally.settled_from = 10.0
    tally.record("GET queue", "200", 4.0, sent=9.9)
    tally.record("GET queue", "200", 0.2, sent=10.0)
    tally.record("GET queue", "200", 0.3, sent=12.0)
    assert tally.latencies["GET queue"] == [5.0, 4.0, 0.2, 0.3]
    assert tally.settled["GET queue"] == [0.2, 0.3]
