"""The feedback row's record, its id, what a turn is, and how overlapping feedback becomes one polarity a message."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError

from factory.export._feedback_rows import message_polarities
from factory.store import FeedbackRecord, Store, assistant_message_indexes, feedback_id, utc_now

MESSAGES = [{"role": "system"}, {"role": "user"}, {"role": "assistant"}, {"role": "tool"}, {"role": "assistant"},
            {"role": "tool"}, {"role": "assistant"}]


def record(**fields) -> FeedbackRecord:
    base = {"feedback_id": "fb-x", "run_id": "r", "task_id": "t", "branch_index": 0, "polarity": "negative",
            "source": "user", "status": "accepted", "created_at": utc_now()}
    return FeedbackRecord(**{**base, **fields})


def test_a_turn_is_counted_in_assistant_messages():
    assert assistant_message_indexes(MESSAGES) == [2, 4, 6]
    assert record(turn=1).message_span(MESSAGES) == (4, 5)
    assert record(turn=3).message_span(MESSAGES) is None
    assert record(span_start=3, span_end=7).message_span(MESSAGES) == (3, 7)
    assert record(span_start=3, span_end=8).message_span(MESSAGES) is None


@pytest.mark.parametrize(("fields", "message"), [
    ({}, "give a turn or a span"),
    ({"turn": 1, "span_start": 0, "span_end": 2}, "not both"),
    ({"span_start": 3, "span_end": 3}, "span [3, 3) is empty"),
    ({"turn": 0, "polarity": "bad"}, "polarity"),
    ({"turn": -1}, "turn"),
])
def test_a_row_targets_exactly_one_turn_or_non_empty_span(fields, message):
    with pytest.raises(ValidationError, match=re.escape(message)):
        record(**fields)


def test_the_id_is_the_key_and_only_the_key():
    one = feedback_id("r", "t", 0, turn=2, source="user")
    assert one == feedback_id("r", "t", 0, turn=2, source="user") and one.startswith("fb-") and len(one) == 19
    others = {feedback_id("r", "t", 0, turn=2, source="verifier"), feedback_id("r", "t", 1, turn=2, source="user"),
              feedback_id("r", "t", 0, turn=3, source="user"), feedback_id("r", "t", 0, span=(2, 3), source="user")}
    assert one not in others and len(others) == 4


def test_overlapping_feedback_resolves_to_one_polarity_per_message():
    spans = [{"start": 2, "end": 7, "polarity": "positive", "source": "verifier"},
             {"start": 4, "end": 5, "polarity": "negative", "source": "verifier"},  # negative beats positive
             {"start": 6, "end": 7, "polarity": "neutral", "source": "user"}]  # a person beats a proposal
    assert message_polarities(MESSAGES, spans) == ["neutral", "neutral", "positive", "neutral", "negative",
                                                   "neutral", "neutral"]  # tool messages: never in a loss


def test_a_store_from_before_the_feedback_table_reads_as_having_none(tmp_path):
    old = tmp_path / "old.duckdb"
    shutil.copy(Path(__file__).resolve().parents[1] / "data" / "store-v6.duckdb", old)
    with Store.open(old, read_only=True) as store:
        assert "feedback" not in store.tables()
        assert store.feedback("r").is_empty() and store.accepted_feedback(["r"]).is_empty()
