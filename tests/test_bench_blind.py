"""bench/blind's direction check and lines (issue #63 item 6), from made-up figures: a run whose
share moved more than 0.1 must win (or lose) against version 0 the way it moved; a smaller move
checks nothing; and bench/live_steering's summary counts them."""

from __future__ import annotations

from typing import Any

from bench.blind import Arm, blind_choice, blind_lines, direction


def test_direction_checks_only_a_move_above_a_tenth() -> None:
    assert direction(0.7, +0.25) is True
    assert direction(0.3, -0.25) is True
    assert direction(0.4, +0.25) is False
    assert direction(0.5, +0.25) is False  # even is no direction
    assert direction(0.9, +0.1) is None and direction(0.1, -0.05) is None


def test_a_voter_votes_by_the_preference_alone() -> None:
    def prefer(_prompt: str, text: str) -> int:
        return len(text)

    assert blind_choice(prefer, "p", "aaa", "a") == "a"
    assert blind_choice(prefer, "p", "a", "aaa") == "b"
    assert blind_choice(prefer, "p", "aa", "bb") == "tie"
    assert blind_choice(prefer, "p", "a", "b") == "both_bad"


def _rate(version: str, rate: float, votes: int, need: int) -> dict[str, Any]:
    return {"version": version, "rate": rate, "votes": votes, "interval": {"low": rate - 0.15, "high": rate + 0.15},
            "verdict": "better than the baseline" if rate > 0.65 else "too few votes to tell", "votes_for_margin": need}


def test_the_lines_name_each_run_its_share_move_and_the_check() -> None:
    figures = {"evaluation": 7, "cast": 130, "voters": 3, "checks": 10, "both_bad_share": 0.2, "newest": {1: 30, 2: 30},
               "win_rates": [_rate("v30", 0.8, 40, 62), _rate("run 2 v30", 0.55, 40, 96)]}
    lines, arms = blind_lines(figures, [Arm(run=1, name="people", move=0.3, start=0.2, end=0.5),
                                        Arm(run=2, name="twin", move=0.05, start=0.2, end=0.25)], prefix="g5 s0 ")
    assert lines[0] == "g5 s0 blind votes: evaluation 7, 130 votes cast by 3 voters (10 planted checks), both-bad share 0.200"
    assert lines[1] == ("g5 s0 blind people v30 vs v0: win rate 0.800 [0.650, 0.950] over 40 votes (better than the "
                        "baseline); share 0.200 -> 0.500, moved +0.300: agree; ±0.1 needs 62 votes")
    assert "share 0.200 -> 0.250, moved +0.050 (<= 0.1): no check; ±0.1 needs 96 votes" in lines[2]
    assert [(a.arm.name, a.agree, a.votes_for_margin) for a in arms] == [("people", True, 62), ("twin", None, 96)]


def test_the_summary_counts_the_runs_checked_and_agreeing() -> None:
    from bench.blind import ArmVotes
    from bench.live_steering import PairResult, blind_summary
    from bench.steering import Sampled

    base = Sampled(share=0.2, arithmetic=0.3, untagged=0.0)

    def pair(*checks: tuple[bool | None, int]) -> PairResult:
        return PairResult(preference="generated:5", description="", mixed=False, seed=0, base=base, people=base,
                          twin=base, labels=0, rollouts=0, late=0, breaks=0, lags_rm=[], lags_effect=[], seconds_rm=[],
                          seconds_effect=[], untaught=0, rm="-", seconds=0.0, load="",
                          blind=[ArmVotes(arm=Arm(run=1, name="people", move=0.0), rate=0.5, votes=40,
                                          votes_for_margin=need, agree=agree) for agree, need in checks])

    assert blind_summary([pair()]) is None
    line = blind_summary([pair((True, 60), (None, 90)), pair((False, 80), (None, 96)), pair()])
    assert line == ("blind votes over 2 pairs (4 runs against version 0): 2 checked (share moved > 0.1), 1 agreeing "
                    "in direction; ±0.1 needs median 85 votes (most 96)")
