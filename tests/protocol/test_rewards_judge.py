"""The built-in `llm_judge` against a real local OpenAI-compatible endpoint (tests/fake_judge.py):
scores parsed and scaled, concurrent requests, the key sent from the learner's environment,
retries, failures, timeouts and the outbound policy; its kwargs at run creation."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import ValidationError

from protocol import rewards
from protocol.outbound import PUBLIC_ONLY, OutboundPolicy
from protocol.rewards import RewardError
from protocol.rewards_judge import JudgeHost, parse_score, use_host
from protocol.run_config import RewardSpec
from tests.fake_judge import Reply, fake_judge

# integration: a judge HTTP server on 127.0.0.1 (tests/fake_judge.py)
pytestmark = pytest.mark.integration

LOCAL = OutboundPolicy(allow_private=True)  # the fake judge listens on 127.0.0.1
KEY_ENV = "ASYNCGRPO_TEST_JUDGE_KEY"


@pytest.fixture(autouse=True)
def local_host() -> Iterator[None]:
    previous = use_host(JudgeHost(policy=LOCAL))
    try:
        yield
    finally:
        use_host(previous)


def judge(url: str, completions: list[Any], **kwargs: Any) -> list[float | None]:
    kwargs.setdefault("prompt_template", "{completion}")
    columns = kwargs.pop("columns", {})
    prompts = kwargs.pop("prompts", ["q"] * len(completions))
    return rewards.llm_judge(
        prompts, completions, base_url=url, model="judge-1", **kwargs, **columns
    )


def test_scores_are_parsed_and_scaled_by_max_score() -> None:
    with fake_judge() as fake:
        got = judge(fake.url, ["7", "Score: 10", "0", "2.5 out of 10"], max_score=10)
        assert got == [0.7, 1.0, 0.0, 0.25]
        assert judge(fake.url, ["I'd say 3, no: 1"], max_score=1) == [1.0]
        assert judge(fake.url, ["I'd say 3, no: 1"], max_score=10, pick="first") == [0.3]
    # the first call's four requests run concurrently: their order of arrival is not fixed
    first_call = list(fake.requests[:4])
    assert {r["path"] for r in first_call} == {"/v1/chat/completions"}
    contents = sorted(r["body"]["messages"][0]["content"] for r in first_call)
    assert contents == sorted(["7", "Score: 10", "0", "2.5 out of 10"])
    for request in first_call:
        body = request["body"]
        assert body["model"] == "judge-1" and body["temperature"] == 0.0
        assert [m["role"] for m in body["messages"]] == ["user"]
        assert "max_tokens" not in body


def test_the_template_gets_prompt_completion_reference_and_columns() -> None:
    template = "Q={prompt} A={completion} R={reference} T={topic}"
    prompts = [
        "What is 2+2?",
        [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}],
    ]
    with fake_judge(lambda body, n: Reply("5")) as fake:
        got = judge(
            fake.url,
            ["4", "Hello"],
            prompts=prompts,
            prompt_template=template,
            max_tokens=8,
            columns={"answer": ["4", None], "topic": ["math", "chat"]},
        )
    assert got == [0.5, 0.5]
    sent = sorted(r["body"]["messages"][0]["content"] for r in fake.requests)
    assert sent == [
        "Q=What is 2+2? A=4 R=4 T=math",
        "Q=system: Be terse.\nuser: Hi A=Hello R= T=chat",
    ]
    assert {r["body"]["max_tokens"] for r in fake.requests} == {8}
    with pytest.raises(
        RewardError, match=r"names topic, not reference columns of this batch \(it has: answer\)"
    ):
        judge("http://127.0.0.1:9/v1", ["4"], prompt_template=template, columns={"answer": ["4"]})


def test_the_default_template_asks_for_0_to_10_with_the_reference() -> None:
    with fake_judge(lambda body, n: Reply("8")) as fake:
        got = rewards.llm_judge(["2+2?"], ["4"], base_url=fake.url, model="m", answer=["4"])
    assert got == [0.8]
    text = fake.requests[0]["body"]["messages"][0]["content"]
    assert "2+2?" in text and "from 0 to 10" in text and "Reference answer" in text


def _together(parties: int) -> Any:
    """An answer that waits until `parties` requests are in the judge at once (a barrier;
    it breaks after 20 s, failing the request, when they never are)."""
    barrier = threading.Barrier(parties, timeout=20)

    def answer(body: dict[str, Any], n: int) -> Reply:
        barrier.wait()
        return Reply("1")

    return answer


def test_requests_are_sent_concurrently_up_to_max_concurrency() -> None:
    with fake_judge(_together(4)) as fake:
        assert judge(fake.url, ["x"] * 8, max_concurrency=4, max_score=1) == [1.0] * 8
    assert fake.max_active == 4 and len(fake.requests) == 8
    with fake_judge(_together(16)) as fake:  # past the 10 connections of httpx's default pool
        assert judge(fake.url, ["x"] * 16, max_concurrency=16, max_score=1) == [1.0] * 16
    assert fake.max_active == 16
    with fake_judge(lambda body, n: Reply("1", delay_s=0.05)) as fake:
        judge(fake.url, ["x"] * 4, max_concurrency=1, max_score=1)
    assert fake.max_active == 1


def test_the_key_is_sent_as_bearer_from_the_named_environment_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(KEY_ENV, "secret-judge-key")
    with fake_judge() as fake:
        judge(fake.url, ["1"], api_key_env=KEY_ENV)
        judge(fake.url, ["1"])
    assert fake.requests[0]["headers"]["Authorization"] == "Bearer secret-judge-key"
    assert "Authorization" not in fake.requests[1]["headers"]
    # the host's environment (the reward pool passes the learner's) wins over os.environ
    use_host(JudgeHost(policy=LOCAL, environ={KEY_ENV: "from-the-host"}))
    with fake_judge() as fake:
        judge(fake.url, ["1"], api_key_env=KEY_ENV)
    assert fake.requests[0]["headers"]["Authorization"] == "Bearer from-the-host"
    monkeypatch.delenv(KEY_ENV)
    use_host(JudgeHost(policy=LOCAL))
    with pytest.raises(RewardError, match=f"{KEY_ENV} \\(api_key_env\\) is not set"):
        judge("http://127.0.0.1:9/v1", ["1"], api_key_env=KEY_ENV)


def test_a_500_or_an_unparsable_reply_is_retried_then_scores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("protocol.rewards_judge.BACKOFF_S", 0.01)
    plan = [Reply(status=500), Reply("I refuse to grade"), Reply(status=429), Reply("9")]
    with fake_judge(lambda body, n: plan[n]) as fake:
        assert judge(fake.url, ["x"], max_retries=3) == [0.9]
    assert len(fake.requests) == 4


def test_a_judge_failing_after_its_retries_raises_reward_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("protocol.rewards_judge.BACKOFF_S", 0.01)
    with fake_judge(lambda body, n: Reply(status=503)) as fake:
        with pytest.raises(RewardError, match=r"answered 503 \(after 3 attempts\)"):
            judge(fake.url, ["x"], max_retries=2, max_concurrency=1)
    assert len(fake.requests) == 3
    with fake_judge(lambda body, n: Reply("eleven")) as fake:
        with pytest.raises(RewardError, match="no score from 0 to 10 in the reply 'eleven'"):
            judge(fake.url, ["x"], max_retries=0)
    with fake_judge(lambda body, n: Reply("42")) as fake:  # out of range: not a score
        with pytest.raises(RewardError, match="no score from 0 to 10"):
            judge(fake.url, ["x"], max_retries=0)
    with fake_judge(lambda body, n: Reply(raw="not json")) as fake:
        with pytest.raises(RewardError, match="not a chat completion"):
            judge(fake.url, ["x"], max_retries=0)


def test_a_client_error_is_not_retried() -> None:
    with fake_judge(lambda body, n: Reply(status=401, raw='{"error": "bad key"}')) as fake:
        with pytest.raises(RewardError, match="answered 401: .*bad key"):
            judge(fake.url, ["x"], max_retries=3)
    assert len(fake.requests) == 1
    with fake_judge() as fake:  # a wrong base_url: 404
        with pytest.raises(RewardError, match="answered 404"):
            judge(fake.url.removesuffix("/v1") + "/wrong", ["x"])


def test_the_timeout_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("protocol.rewards_judge.BACKOFF_S", 0.01)
    with fake_judge(lambda body, n: Reply("5", delay_s=5.0 if n == 0 else 0.0)) as fake:
        started = time.monotonic()
        assert judge(fake.url, ["x"], timeout_s=0.5, max_retries=1) == [0.5]
        assert time.monotonic() - started < 3.0  # the judge would answer after 5 s
    with fake_judge(lambda body, n: Reply("5", delay_s=5.0)) as fake:
        started = time.monotonic()
        with pytest.raises(RewardError, match=r"timed out \(ReadTimeout\) \(after 1 attempts\)"):
            judge(fake.url, ["x"], timeout_s=0.3, max_retries=0)
        assert time.monotonic() - started < 3.0


def test_the_outbound_policy_refuses_the_judges_host() -> None:
    use_host(JudgeHost(policy=PUBLIC_ONLY))
    with fake_judge() as fake:
        with pytest.raises(RewardError, match="outbound policy refused .*127.0.0.1 is a loopback"):
            judge(fake.url, ["x"], max_retries=3)
    assert fake.requests == []  # nothing was sent, and no retry
    allowed = OutboundPolicy.from_settings(False, ["127.0.0.0/8"])
    use_host(JudgeHost(policy=allowed))
    with fake_judge() as fake:
        assert judge(fake.url, ["3"]) == [0.3]


def test_parse_score() -> None:
    assert parse_score("Score: 7/10", "first", 10) == 0.7
    assert parse_score("Score: 7/10", "last", 10) == 0.7
    assert parse_score("3 out of 10, no: 4 OUT OF 10", "last", 10) == 0.4
    assert parse_score("no number", "last", 10) is None
    assert parse_score("-1", "last", 10) is None


def spec(**kwargs: Any) -> RewardSpec:
    return RewardSpec(
        name="llm_judge", kwargs={"base_url": "http://judge:8000/v1", "model": "m", **kwargs}
    )


def test_run_creation_validates_the_judges_kwargs() -> None:
    assert spec(api_key_env="JUDGE_KEY", max_concurrency=16).kwargs["api_key_env"] == "JUDGE_KEY"
    refused: dict[str, tuple[dict[str, Any], str]] = {
        "api_key": ({"api_key": "sk-abc"}, "the API key never goes in the run config"),
        "key in env name": ({"api_key_env": "sk-proj-abcdef"}, "NAME of an environment variable"),
        "key-like name": ({"api_key_env": "sk_live_abcdef"}, "looks like a key"),
        "scheme": ({"base_url": "ftp://judge/v1"}, "http\\(s\\) URL with a host"),
        "credentials": ({"base_url": "http://u:p@judge/v1"}, "no credentials or query"),
        "query": ({"base_url": "http://judge/v1?key=1"}, "no credentials or query"),
        "ipv6": ({"base_url": "http://[::1/v1"}, "base_url is not a URL"),
        "port": ({"base_url": "http://judge:99999/v1"}, "base_url is not a URL"),
        "model": ({"model": ""}, "model is required"),
        "template attr": ({"prompt_template": "{completion.__class__}"}, "must be a plain name"),
        "template spec": ({"prompt_template": "{completion:>10}"}, "must be a plain name"),
        "no completion": ({"prompt_template": "{prompt}"}, "must contain \\{completion\\}"),
        "bad template": ({"prompt_template": "{completion"}, "not a valid template"),
        "retries": ({"max_retries": 11}, "max_retries must be an integer from 0 to 10"),
        "concurrency": ({"max_concurrency": 0}, "max_concurrency must be an integer from 1 to 64"),
        "timeout": ({"timeout_s": "5"}, "kwargs.timeout_s: Input should be a valid number"),
        "timeout range": ({"timeout_s": 0}, "timeout_s must be a number"),
        "pick": ({"pick": "middle"}, "pick must be 'first' or 'last'"),
        "unknown": (
            {"batch_size": 4},
            "llm_judge takes no argument batch_size \\(it takes: base_url, model, api_key_env",
        ),
    }
    for case, (kwargs, message) in refused.items():
        with pytest.raises(ValidationError, match=message):
            spec(**kwargs)
            pytest.fail(case)
    with pytest.raises(ValidationError, match="base_url is required"):
        RewardSpec(name="llm_judge", kwargs={"model": "m"})
    with pytest.raises(ValidationError) as caught:
        spec(api_key="sk-very-secret")
    assert "sk-very-secret" not in str(caught.value.errors(include_input=False))
