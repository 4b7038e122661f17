"""The reward pool (learner/reward_pool.py): rewards score in warm forkserver children with a
hard timeout per batch; a reward that hangs, raises or dies fails that batch only, one that
cannot be resolved fails at start (the run fails)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from learner.reward_pool import RewardBatchFailed, RewardPool, RewardPoolClosed
from protocol.rewards import BUILTINS, RewardAllowlist, RewardError, resolve
from protocol.run_config import RewardSpec

# integration: the reward pool's child processes
pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
MOD = "tests.learner.rewards_for_tests"
ALLOWED = RewardAllowlist(modules=frozenset({MOD, "asyncgrpo_tests_no_such_module"}))


def spec(name: str, weight: float = 1.0, **kwargs: Any) -> RewardSpec:
    """A built-in or `module:function` as given; else a reward of rewards_for_tests."""
    full = name if name in BUILTINS or ":" in name else f"{MOD}:{name}"
    return RewardSpec(name=full, weight=weight, kwargs=kwargs)


def _gone(pid: int, within_s: float = 10.0) -> bool:
    """The process has exited (no /proc entry, or a zombie awaiting its parent's wait)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except FileNotFoundError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.1)
    return False


def test_a_hung_reward_is_killed_and_the_next_batch_scores_in_a_fresh_child() -> None:
    with RewardPool([spec("pid"), spec("sleepy", 2.0)], timeout_s=2.0, allowed=ALLOWED) as pool:
        first = pool.score(["p", "q"], ["ok", "fine"], {})
        warm = int(first.per_reward[f"{MOD}:pid"][0])
        assert warm != os.getpid()
        assert pool.score(["p"], ["again"], {}).per_reward[f"{MOD}:pid"] == [float(warm)]
        started = time.monotonic()
        with pytest.raises(RewardBatchFailed) as caught:
            pool.score(["p", "q"], ["ok", "sleep now"], {})
        waited = time.monotonic() - started
        assert caught.value.reward == f"{MOD}:sleepy"
        assert "did not finish within 2 s (timeout)" in caught.value.detail
        assert 1.5 < waited < 6.0
        assert _gone(warm), "the hung child was not killed"
        after = pool.score(["p"], ["ok"], {})
        fresh = after.per_reward[f"{MOD}:pid"][0]
        assert fresh != warm and after.per_reward[f"{MOD}:sleepy"] == [1.0]
        assert after.total == [fresh + 2.0]


def test_a_reward_raising_on_one_batch_fails_that_batch_only() -> None:
    with RewardPool([spec("flaky", 3.0)], timeout_s=30.0, allowed=ALLOWED) as pool:
        with pytest.raises(RewardBatchFailed, match="raised ValueError: boom in a completion"):
            pool.score(["p", "q"], ["boom", "x"], {})
        assert pool.score(["p", "q"], ["a", "b"], {}).total == [1.5, 1.5]


def test_unusable_output_and_a_dying_process_fail_that_batch_only() -> None:
    with RewardPool([spec("dies"), spec("numeric_match")], timeout_s=30.0, allowed=ALLOWED) as pool:
        with pytest.raises(RewardBatchFailed, match="process died"):
            pool.score(["p"], ["die"], {"answer": ["1"]})
        with pytest.raises(RewardBatchFailed, match="needs an `answer` reference column"):
            pool.score(["p"], ["1"], {})
        good = pool.score(["p", "q"], ["it is 1", "2"], {"answer": ["1", "3"]})
        assert good.per_reward == {f"{MOD}:dies": [0.0, 0.0], "numeric_match": [1.0, 0.0]}


def test_a_sigalrm_reward_works_when_scoring_from_a_thread() -> None:
    alarm = resolve(f"{MOD}:by_alarm", ALLOWED)
    errors: list[BaseException] = []
    results: list[Any] = []

    def direct() -> None:  # what scoring in the learner's own intake thread would do
        try:
            alarm(["p"], ["abc"])
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def pooled(pool: RewardPool) -> None:
        results.append(pool.score(["p", "q"], ["abc", "hello"], {}))

    thread = threading.Thread(target=direct)
    thread.start()
    thread.join()
    assert errors and "main thread" in str(errors[0])
    with RewardPool([spec("by_alarm")], timeout_s=30.0, allowed=ALLOWED) as pool:
        thread = threading.Thread(target=pooled, args=(pool,))
        thread.start()
        thread.join(60)
    assert results and results[0].total == [3.0, 5.0]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("asyncgrpo_tests_no_such_module:reward", "cannot import reward module"),
        (f"{MOD}:nothing_here", "has no callable 'nothing_here'"),
    ],
)
def test_a_reward_that_cannot_be_resolved_fails_at_start(name: str, message: str) -> None:
    with pytest.raises(RewardError, match=message):
        RewardPool([spec("numeric_match"), spec(name)], timeout_s=5.0, allowed=ALLOWED)


def test_the_batch_deadline_covers_all_its_rewards() -> None:
    """Two rewards of 1.2 s each: either alone fits in 2 s, both do not."""
    with RewardPool(
        [spec("slow", seconds=1.2), spec("slow", seconds=1.2)], timeout_s=2.0, allowed=ALLOWED
    ) as pool:
        started = time.monotonic()
        with pytest.raises(RewardBatchFailed, match=r"within 2 s \(timeout\)"):
            pool.score(["p"], ["x"], {})
        assert time.monotonic() - started < 6.0
    with RewardPool([spec("slow", seconds=1.2)], timeout_s=2.0, allowed=ALLOWED) as pool:
        assert pool.score(["p"], ["x"], {}).total == [1.0]


def test_close_kills_the_children_and_ends_a_score_in_flight() -> None:
    """The learner stopping mid-batch: the score in another thread ends at once, not as a
    batch failure (which would reject the batch), and no child is left behind."""
    pool = RewardPool([spec("pid"), spec("sleepy")], timeout_s=60.0, allowed=ALLOWED)
    child = int(pool.score(["p"], ["x"], {}).total[0] - 1.0)
    outcome: list[BaseException] = []

    def hang() -> None:
        try:
            pool.score(["p"], ["sleep"], {})
        except BaseException as exc:  # noqa: BLE001
            outcome.append(exc)

    thread = threading.Thread(target=hang)
    thread.start()
    time.sleep(0.5)
    pool.close()
    thread.join(5)
    assert not thread.is_alive() and isinstance(outcome[0], RewardPoolClosed)
    assert _gone(child), "close left the child running"
    with pytest.raises(RewardPoolClosed):
        pool.score(["p"], ["x"], {})


def test_the_children_load_only_what_the_allowlist_names() -> None:
    """The allowlist travels to the child processes: the same module is refused there without
    it and loads with it, by module or as an entry point."""
    with pytest.raises(RewardError, match=f"reward module '{MOD}' is not allowed on this"):
        RewardPool([spec("pid")], timeout_s=5.0)
    entry_point = RewardSpec(name="my_pid")
    with pytest.raises(RewardError, match="'my_pid' is not an entry point"):
        RewardPool([entry_point], timeout_s=5.0)
    by_entry_point = RewardAllowlist(entry_points={"my_pid": f"{MOD}:pid"})
    with RewardPool([entry_point], timeout_s=30.0, allowed=by_entry_point) as pool:
        child = pool.score(["p"], ["c"], {}).per_reward["my_pid"][0]
    assert child != float(os.getpid())  # scored in a child, through the entry point


def test_a_standard_library_reward_is_refused_even_when_its_module_is_listed() -> None:
    allowed = RewardAllowlist(modules=frozenset({"os", "subprocess"}))
    for name in ("os:system", "subprocess:run"):
        # run validation refuses these names too: model_construct stands for a run stored
        # before it did
        stored = RewardSpec.model_construct(name=name, weight=1.0, kwargs={})
        with pytest.raises(RewardError, match="standard library"):
            RewardPool([stored], timeout_s=5.0, allowed=allowed)


def test_math_verify_scores_in_a_child_with_its_alarm_guards() -> None:
    """math_verify in a reward process: its child's main thread, where math-verify's SIGALRM
    guards are on (the off-main-thread path: tests/protocol/test_rewards_math.py)."""
    specs = [RewardSpec(name="math_verify", kwargs={"column": "solution"})]
    with RewardPool(specs) as pool:
        got = pool.score(
            ["p"] * 3,
            ["\\boxed{\\frac{1}{2}}", "so 72", "no idea"],
            {"solution": ["0.5", "… #### 72", "3"]},
        )
    assert got.per_reward["math_verify"] == [1.0, 1.0, 0.0]
