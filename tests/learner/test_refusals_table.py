"""learner/refusals.py's table: every 409 code is either a learner call's, with what the learner
does about it, or named as no learner call's; only LEASE_LOST re-attaches; a code outside the
table is `unexpected` (raised)."""

from __future__ import annotations

from learner.refusals import NOT_LEARNER_409, ON_409, OnConflict, on_409
from protocol.client import ApiError
from protocol.error_codes import LEASE_LOST, STATUS, ErrorCode


def test_every_409_code_has_a_decision() -> None:
    conflicts = {code for code, status in STATUS.items() if status == 409}
    decided = {code for table in ON_409.values() for code in table}
    assert decided | NOT_LEARNER_409 == conflicts
    assert not decided & NOT_LEARNER_409


def test_only_the_lease_codes_re_attach() -> None:
    for table in ON_409.values():
        for code, action in table.items():
            assert (action is OnConflict.lease_lost) == (code in LEASE_LOST), code


def test_an_answer_outside_the_table_is_unexpected() -> None:
    def answer(status: int, code: str) -> ApiError:
        return ApiError(status, "refused", {"detail": "refused", "code": code})

    assert on_409("publish", answer(409, "version_not_next")) is OnConflict.reconcile
    assert on_409("claim", answer(409, "version_not_next")) is OnConflict.unexpected
    assert on_409("publish", answer(409, "a_code_of_a_newer_server")) is OnConflict.unexpected
    assert on_409("publish", answer(422, ErrorCode.duplicate_file)) is OnConflict.unexpected
    assert on_409("reject", answer(409, "fencing_lost")) is OnConflict.lease_lost
