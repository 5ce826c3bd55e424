"""What token-by-token streaming may send before the answer is whole (the live path through a
server and worker is in tests/envapi/test_openai_endpoint.py)."""

from __future__ import annotations

import pytest

from apps.envapi.openai_services import LiveText


def _feed(live: LiveText, pieces: list[str]) -> list[str]:
    return [live.add(p) for p in pieces]


def test_plain_text_goes_out_piece_by_piece() -> None:
    live = LiveText([])
    assert _feed(live, ["<ans", "wer>", "12", "</answer>"]) == ["<ans", "wer>", "12", "</answer>"]
    assert live.rest("<answer>12</answer>") == ""


def test_what_may_start_a_tool_call_is_held_back_and_a_call_ends_the_text() -> None:
    live = LiveText(["<tool_call>"])
    out = _feed(live, ["Let me ", "<", "tool", "_call", ">{\"name\"", "}"])
    assert "".join(out) == "Let me " and out[1:] == ["", "", "", "", ""]
    # The parsed answer's content is what was sent: nothing more to add.
    assert live.rest("Let me ") == ""


def test_a_held_back_tail_that_turns_out_to_be_text_goes_out() -> None:
    live = LiveText(["<tool_call>"])
    assert _feed(live, ["<", "answer>", "3"]) == ["", "<answer>", "3"]


@pytest.mark.parametrize("pieces", [["ab", "cST", "OPde"], ["abcSTOPde"], ["abc", "S", "T", "O", "P", "x"]])
def test_a_stop_string_cuts_the_text_where_the_engine_cuts_it(pieces: list[str]) -> None:
    live = LiveText(["STOP"])
    assert "".join(_feed(live, pieces)) == "abc"
    assert live.rest("abc") == ""


def test_the_answer_adds_what_was_held_back_when_no_marker_came() -> None:
    live = LiveText(["STOP"])
    assert "".join(_feed(live, ["abc", "ST"])) == "abc"
    assert live.rest("abcST") == "ST"
