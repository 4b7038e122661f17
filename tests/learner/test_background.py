"""learner/background.py: a call beside training, on a thread (overlap) or run lazily by
result() (the serial loop); its exception reaches the caller's thread."""

from __future__ import annotations

import threading

import pytest

from learner.background import Pending

pytestmark = pytest.mark.timeout(30)


def test_a_background_call_runs_at_once_on_another_thread() -> None:
    started = threading.Event()
    release = threading.Event()
    ran_on: list[str] = []

    def work() -> int:
        ran_on.append(threading.current_thread().name)
        started.set()
        release.wait(10)
        return 7

    call = Pending("bg", work, background=True)
    assert started.wait(10) and not call.done  # running before anyone asks for it
    release.set()
    assert call.result() == 7 and call.done
    assert ran_on == ["bg"] and call.seconds > 0


def test_an_inline_call_runs_only_when_asked_on_the_callers_thread() -> None:
    ran_on: list[str] = []
    call = Pending(
        "inline", lambda: ran_on.append(threading.current_thread().name), background=False
    )
    assert ran_on == [] and not call.done
    call.result()
    assert ran_on == [threading.current_thread().name]


@pytest.mark.parametrize("background", [True, False])
def test_the_exception_is_raised_by_result(background: bool) -> None:
    def fail() -> None:
        raise ValueError("bucket refused")

    call = Pending("failing", fail, background=background)
    with pytest.raises(ValueError, match="bucket refused"):
        call.result()
    assert isinstance(call.error(), ValueError)


def test_poll_can_stop_the_wait() -> None:
    release = threading.Event()
    call = Pending("slow", lambda: release.wait(10), background=True)

    class Stop(Exception):
        pass

    def poll() -> None:
        raise Stop

    with pytest.raises(Stop):
        call.result(poll)
    assert call.error() is None  # still running: no error yet
    release.set()
    call.join(10)
    assert call.done
