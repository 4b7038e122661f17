"""The engine guard: one restart per engine death however many generations it broke, after they
have all left the engine, and no generation starts while the engine restarts."""

from __future__ import annotations

import threading
import time

import pytest

from worker.engine import EngineGuard, FaultWindow

pytestmark = pytest.mark.timeout(30)


def test_one_death_under_three_generations_restarts_once_after_all_left() -> None:
    restarts: list[tuple[str, int]] = []
    guard: EngineGuard

    def restart(why: str) -> None:
        restarts.append((why, guard._active))
        time.sleep(0.2)

    guard = EngineGuard(restart)
    inside = threading.Barrier(3)
    epochs: list[int] = []

    def generation(delay: float) -> None:
        with guard.generating() as epoch:
            inside.wait()
            time.sleep(delay)  # the later ones are still in the engine when the first reports
        epochs.append(epoch)
        guard.fault(epoch, f"died ({delay})")

    threads = [threading.Thread(target=generation, args=(d,)) for d in (0.0, 0.1, 0.3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert epochs == [0, 0, 0]
    assert restarts == [("died (0.0)", 0)]  # once, with no generation left in the engine

    # A later death is a new death: one more restart.
    with guard.generating() as epoch:
        assert epoch == 1
    guard.fault(epoch, "again")
    assert [why for why, _ in restarts] == ["died (0.0)", "again"]


def test_no_generation_starts_while_the_engine_restarts() -> None:
    restarting = threading.Event()
    release = threading.Event()

    def restart(_why: str) -> None:
        restarting.set()
        release.wait(5)

    guard = EngineGuard(restart)
    with guard.generating() as epoch:
        pass
    fault = threading.Thread(target=guard.fault, args=(epoch, "died"))
    fault.start()
    restarting.wait(5)
    entered = threading.Event()

    def later() -> None:
        with guard.generating():
            entered.set()

    waiter = threading.Thread(target=later)
    waiter.start()
    assert not entered.wait(0.3)  # held back during the restart
    release.set()
    assert entered.wait(5)
    fault.join()
    waiter.join()


def test_the_guard_closes_at_the_death_before_the_lease_is_released() -> None:
    """A lease's release requeues its prompts, and a lease granted on them meanwhile must not
    start on the dead engine: the death closes the guard at once, the restart comes after."""
    restarts: list[str] = []
    guard = EngineGuard(restarts.append)
    with guard.generating() as epoch:
        pass
    assert guard.close(epoch)  # the first report of this death
    assert not guard.close(epoch)  # another lease broken by the same death
    entered = threading.Event()

    def granted_meanwhile() -> None:
        with guard.generating():
            entered.set()

    waiter = threading.Thread(target=granted_meanwhile)
    waiter.start()
    assert not entered.wait(0.3)  # held back while the broken leases are released
    assert restarts == []
    guard.reopen("died")
    assert entered.wait(5)
    waiter.join()
    assert restarts == ["died"]


def test_a_restart_that_raises_opens_the_guard_again() -> None:
    def restart(_why: str) -> None:
        raise SystemExit("engine failing")

    guard = EngineGuard(restart)
    with guard.generating() as epoch:
        pass
    with pytest.raises(SystemExit):
        guard.fault(epoch, "died")
    with guard.generating() as later:  # does not hang
        assert later == 1


def test_fault_window_counts_deaths_within_the_window_only() -> None:
    window = FaultWindow(limit=3, window_s=10.0)
    assert not window.record(0.0)
    assert not window.record(5.0)
    assert not window.record(20.0)  # the first two fell out of the window
    assert not window.record(25.0)
    assert window.record(29.0)
