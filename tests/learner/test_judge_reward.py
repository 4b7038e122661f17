"""`llm_judge` in the learner: scored in the reward pool's child processes with the learner
host's outbound policy and key (a key variable set after the forkserver started still
arrives); a judge that keeps failing fails the batch (`RewardBatchFailed`, which the intake
rejects `reward_error`), and one whose key variable is unset fails at start."""

from __future__ import annotations

import os
from typing import Any

import pytest

from learner.reward_pool import RewardBatchFailed, RewardPool
from protocol.outbound import OutboundPolicy
from protocol.rewards import RewardError
from protocol.run_config import RewardSpec
from tests.fake_judge import Reply, fake_judge

pytestmark = pytest.mark.timeout(120)
LOCAL = OutboundPolicy(allow_private=True)
KEY_ENV = "ASYNCGRPO_TEST_POOL_JUDGE_KEY"


def judge_spec(url: str, **kwargs: object) -> RewardSpec:
    return RewardSpec(
        name="llm_judge",
        kwargs={"base_url": url, "model": "m", "prompt_template": "{completion}", **kwargs},
    )


@pytest.mark.integration  # a judge server and a child process
def test_the_judge_scores_in_a_child_with_the_hosts_key_and_policy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with RewardPool([RewardSpec(name="think_format")], outbound=LOCAL) as warm:
        warm.score(["p"], ["x"], {})  # the forkserver runs, with the environment of now
    monkeypatch.setenv(KEY_ENV, "pool-key")
    with fake_judge() as fake:
        specs = [judge_spec(fake.url, api_key_env=KEY_ENV), RewardSpec(name="think_format")]
        with RewardPool(specs, timeout_s=30, outbound=LOCAL) as pool:
            got = pool.score(["p", "q"], ["4", "<think>t</think>10"], {})
    assert got.per_reward["llm_judge"] == [0.4, 1.0]
    assert got.total == [0.4, 2.0]
    assert {r["headers"]["Authorization"] for r in fake.requests} == {"Bearer pool-key"}
    assert os.environ[KEY_ENV] == "pool-key"


@pytest.mark.integration  # a judge server and a child process
def test_a_refused_or_failing_judge_fails_the_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("protocol.rewards_judge.BACKOFF_S", 0.01)  # forkserver: not inherited
    with fake_judge(lambda body, n: Reply(status=500)) as fake:
        with RewardPool([judge_spec(fake.url, max_retries=1)], timeout_s=30) as pool:
            with pytest.raises(RewardBatchFailed) as refused:  # the default policy: public only
                pool.score(["p"], ["4"], {})
        assert fake.requests == []
        assert refused.value.reward == "llm_judge"
        assert "outbound policy refused" in refused.value.detail
        with RewardPool(
            [judge_spec(fake.url, max_retries=1)], timeout_s=30, outbound=LOCAL
        ) as pool:
            with pytest.raises(RewardBatchFailed) as failed:
                pool.score(["p"], ["4"], {})
        assert "answered 500 (after 2 attempts)" in failed.value.detail
        assert len(fake.requests) == 2


def test_an_unset_key_variable_fails_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(RewardError, match=f"{KEY_ENV} \\(its api_key_env\\) is not set"):
        RewardPool([judge_spec("http://judge.example.com/v1", api_key_env=KEY_ENV)])


def test_the_learners_outbound_policy_comes_from_the_servers_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pydantic import ValidationError

    from learner.config import LearnerSettings

    given: dict[str, Any] = {"server_url": "http://s:1", "run_id": "r", "token": "agr_lrn_x"}
    assert LearnerSettings(**given).outbound_policy().refusal("10.1.2.3") is not None
    monkeypatch.setenv("ASYNCGRPO_OUTBOUND_ALLOW_CIDRS", '["10.1.0.0/16"]')
    policy = LearnerSettings(**given).outbound_policy()
    assert policy.refusal("10.1.2.3") is None and policy.refusal("10.2.0.1") is not None
    monkeypatch.setenv("ASYNCGRPO_LEARNER_OUTBOUND_ALLOW_PRIVATE", "true")
    assert LearnerSettings(**given).outbound_policy().refusal("127.0.0.1") is None
    monkeypatch.setenv("ASYNCGRPO_OUTBOUND_ALLOW_CIDRS", '["10.1.0.0/33"]')
    with pytest.raises(ValidationError, match="is not a network"):
        LearnerSettings(**given)
