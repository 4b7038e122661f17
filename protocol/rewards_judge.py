"""The built-in reward `llm_judge` (listed in protocol/rewards.py): an OpenAI-compatible chat
endpoint scores each completion.

Per completion one `POST {base_url}/chat/completions` with the filled `prompt_template` as the user
message; the reply's first or last number (`pick`; a scale as in "7/10" or "7 out of 10" is skipped)
in [0, `max_score`], divided by `max_score`, is the reward. Up to `max_concurrency` requests are in
flight at once (a thread pool sharing one HTTP client). A request that times out, cannot connect, is
answered 408, 429 or 5xx, or whose reply holds no usable score is retried `max_retries` times (the
one retry policy, protocol/retrying.py: waits of at most 0.5 s, 1 s, 2 s…, capped at 30 s, with full
jitter); any other 4xx and a destination the outbound policy refuses fail at once. One
completion that still fails raises RewardError: the learner rejects the batch `reward_error`.

What the run config never holds comes from the learner host (`JudgeHost`): the API key, read
from the environment variable named by `api_key_env` (sent as `Authorization: Bearer …`), and
the outbound policy (protocol/outbound.py) every connection goes through. The reward pool
passes both to its child processes with every batch; a direct call uses this process's
environment and the host set with `use_host` (public addresses only by default).
"""

from __future__ import annotations

import os
import re
import string
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import httpx

from protocol.outbound import PUBLIC_ONLY, OutboundPolicy, OutboundRefused, client
from protocol.retrying import retry_call
from protocol.rewards_base import NUMBER, RewardError, text_of

DEFAULT_TEMPLATE = (
    "You grade an answer to a task.\n\nTask:\n{prompt}\n\nReference answer (may be empty):\n"
    "{reference}\n\nAnswer to grade:\n{completion}\n\nHow correct and helpful is the answer, "
    "from 0 (wrong or useless) to 10 (fully correct)? Reply with the score only, a number "
    "from 0 to 10."
)
FIXED_FIELDS = ("prompt", "completion", "reference")
ENV_NAME = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]{0,127}\Z")  # \Z: no trailing newline
KEY_LIKE = re.compile(r"^(sk|pk|rk)[-_]|^(hf|gh[pousr]|xox[abp])_|^eyJ|^AIza|^Bearer\b", re.I)
KEY_KWARGS = ("api_key", "key", "token", "authorization", "headers", "bearer", "secret")
_SCALE = re.compile(r"(?:/|\bout of\b)\s*\d+(?:\.\d+)?", re.IGNORECASE)
_RETRY_STATUS = frozenset({408, 429})
MAX_TEMPLATE_CHARS = 16_384
BACKOFF_S = 0.5  # the first retry's wait is at most this (protocol/retrying.py)
BACKOFF_CAP_S = 30.0


@dataclass(frozen=True)
class JudgeHost:
    """What the learner host gives `llm_judge`, never the run config: the outbound policy
    and the environment `api_key_env` is read from (None: this process's `os.environ`)."""

    policy: OutboundPolicy = PUBLIC_ONLY
    environ: Mapping[str, str] | None = None


_host = JudgeHost()


def use_host(host: JudgeHost) -> JudgeHost:
    """Set the host `llm_judge` calls in this process use; returns the previous one."""
    global _host
    previous, _host = _host, host
    return previous


class _Retry(Exception):
    """A failure worth another try (timeout, 408/429/5xx, a reply without a score)."""


@dataclass(frozen=True)
class _Judge:
    url: str
    model: str
    headers: dict[str, str]
    pick: str
    max_score: float
    temperature: float
    max_tokens: int | None
    max_retries: int

    def body(self, text: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": text}],
            "temperature": self.temperature,
        }
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        return body

    def score(self, http: httpx.Client, text: str) -> float:
        """One completion's score after up to `max_retries` retries, or RewardError."""
        try:
            return retry_call(
                lambda: self._once(http, text),
                transient=lambda exc: isinstance(exc, _Retry),
                base_s=BACKOFF_S,
                cap_s=BACKOFF_CAP_S,
                sleep=time.sleep,
                attempts=self.max_retries + 1,
            )
        except _Retry as exc:
            raise RewardError(f"llm_judge: {exc} (after {self.max_retries + 1} attempts)") from exc

    def _once(self, http: httpx.Client, text: str) -> float:
        try:
            response = http.post(self.url, json=self.body(text), headers=self.headers)
        except OutboundRefused as exc:
            raise RewardError(f"llm_judge: the outbound policy refused {self.url}: {exc}") from exc
        except httpx.TimeoutException as exc:
            raise _Retry(f"{self.url} timed out ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:
            raise _Retry(f"cannot reach {self.url}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 500 or response.status_code in _RETRY_STATUS:
            raise _Retry(f"{self.url} answered {response.status_code}")
        if response.status_code != 200:
            raise RewardError(
                f"llm_judge: {self.url} answered {response.status_code}: {response.text[:300]}"
            )
        return self._parse(response)

    def _parse(self, response: httpx.Response) -> float:
        try:
            reply = response.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise _Retry("the reply is not a chat completion with a message") from exc
        value = parse_score(str(reply), self.pick, self.max_score)
        if value is None:
            raise _Retry(f"no score from 0 to {self.max_score:g} in the reply {str(reply)[:200]!r}")
        return value


def parse_score(reply: str, pick: str, max_score: float) -> float | None:
    """The reply's first or last number divided by `max_score`, or None when there is no
    number or it lies outside [0, max_score]. A scale written after a score ("7/10", "7 out
    of 10") is not a number of the reply."""
    found = NUMBER.findall(_SCALE.sub("", reply))
    if not found:
        return None
    value = float((found[0] if pick == "first" else found[-1]).replace(",", ""))
    return value / max_score if 0 <= value <= max_score else None


def _prompt_text(prompt: Any) -> str:
    """A prompt as text: a string, or chat messages as `role: content` lines."""
    if isinstance(prompt, list):
        return "\n".join(
            f"{m.get('role', 'user')}: {m.get('content', '')}" if isinstance(m, dict) else str(m)
            for m in prompt
        )
    return str(prompt)


def _fields(template: str) -> list[str]:
    return [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]


def _texts(
    template: str,
    prompts: Sequence[Any],
    completions: Sequence[Any],
    reference_column: str,
    columns: Mapping[str, Any],
) -> list[str]:
    wanted = [f for f in _fields(template) if f not in FIXED_FIELDS]
    missing = sorted({f for f in wanted if not isinstance(columns.get(f), list | tuple)})
    if missing:
        raise RewardError(
            f"llm_judge: prompt_template names {', '.join(missing)}, not reference columns of "
            f"this batch (it has: {', '.join(sorted(columns)) or 'none'})"
        )
    refs = columns.get(reference_column)
    refs = refs if isinstance(refs, list | tuple) else [""] * len(completions)
    texts = []
    for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
        values = {f: str(columns[f][i]) for f in wanted}
        reference = "" if refs[i] is None else str(refs[i])
        values.update(prompt=_prompt_text(prompt), completion=text_of(completion))
        texts.append(template.format_map({**values, "reference": reference}))
    return texts


def _headers(api_key_env: str | None, host: JudgeHost) -> dict[str, str]:
    if api_key_env is None:
        return {}
    environ = host.environ if host.environ is not None else os.environ
    key = environ.get(api_key_env)
    if not key:
        raise RewardError(
            f"llm_judge: the environment variable {api_key_env} (api_key_env) is not set where "
            "the learner runs"
        )
    return {"Authorization": f"Bearer {key}"}


def llm_judge(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    base_url: str = "",
    model: str = "",
    api_key_env: str | None = None,
    prompt_template: str = DEFAULT_TEMPLATE,
    reference_column: str = "answer",
    max_score: float = 10.0,
    pick: str = "last",
    temperature: float = 0.0,
    max_tokens: int | None = None,
    timeout_s: float = 60.0,
    max_retries: int = 2,
    max_concurrency: int = 8,
    **columns: Any,
) -> list[float | None]:
    """Each completion's score from an OpenAI-compatible judge, in [0, 1] (module docstring)."""
    check_llm_judge(
        {
            "base_url": base_url,
            "model": model,
            "api_key_env": api_key_env,
            "prompt_template": prompt_template,
            "reference_column": reference_column,
            "max_score": max_score,
            "pick": pick,
            "temperature": temperature,
            "max_tokens": max_tokens,
            "timeout_s": timeout_s,
            "max_retries": max_retries,
            "max_concurrency": max_concurrency,
        }
    )
    host = _host
    judge = _Judge(
        url=base_url.rstrip("/") + "/chat/completions",
        model=model,
        headers=_headers(api_key_env, host),
        pick=pick,
        max_score=float(max_score),
        temperature=float(temperature),
        max_tokens=max_tokens,
        max_retries=max_retries,
    )
    texts = _texts(prompt_template, prompts, completions, reference_column, columns)
    with client(host.policy, timeout_s=timeout_s, max_connections=max_concurrency) as http:
        return list(_score_all(judge, http, texts, max_concurrency))


def _score_all(
    judge: _Judge, http: httpx.Client, texts: list[str], max_concurrency: int
) -> list[float]:
    if not texts:
        return []
    with ThreadPoolExecutor(max_workers=min(max_concurrency, len(texts))) as pool:
        futures = [pool.submit(judge.score, http, text) for text in texts]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        failed = next((f for f in futures if f in done and f.exception() is not None), None)
        if failed is not None:
            for f in futures:
                f.cancel()
            exc = failed.exception()
            assert exc is not None
            raise exc
        return [f.result() for f in futures]


# -- run validation (no network) ----------------------------------------------------------------


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise RewardError(f"llm_judge: {message}")


def check_base_url(url: Any) -> None:
    _need(isinstance(url, str) and bool(url), "base_url is required, e.g. http://host:8000/v1")
    try:
        parsed = urlparse(url)
        parsed.port  # noqa: B018 - raises ValueError on a port out of range or not a number
    except ValueError as exc:
        raise RewardError(f"llm_judge: base_url is not a URL ({exc})") from None
    _need(
        parsed.scheme in ("http", "https") and bool(parsed.hostname),
        f"base_url must be an http(s) URL with a host, e.g. http://host:8000/v1 (got {url!r})",
    )
    _need(
        parsed.username is None and parsed.password is None and not parsed.query,
        "base_url must hold no credentials or query string: the key comes from the learner's "
        "environment variable named by api_key_env",
    )
    _need(len(url) <= 2000, "base_url is longer than 2000 characters")


def check_template(template: Any) -> None:
    _need(
        isinstance(template, str) and 0 < len(template) <= MAX_TEMPLATE_CHARS,
        f"prompt_template must be a non-empty string of at most {MAX_TEMPLATE_CHARS} characters",
    )
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise RewardError(f"llm_judge: prompt_template is not a valid template: {exc}") from None
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        _need(
            bool(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)) and not spec and not conversion,
            f"prompt_template placeholder {{{name}}} must be a plain name: {{prompt}}, "
            "{completion}, {reference} or a reference column such as {answer} (no format "
            "specs, attributes or indexes; write {{ and }} for literal braces)",
        )
    fields = _fields(template)
    _need("completion" in fields, "prompt_template must contain {completion}")


def check_api_key_env(name: Any) -> None:
    if name is None:
        return
    _need(
        isinstance(name, str) and bool(ENV_NAME.match(name)),
        "api_key_env must be the NAME of an environment variable of the learner (letters, "
        "digits, underscores), e.g. JUDGE_API_KEY",
    )
    _need(
        not KEY_LIKE.search(name) and len(name) < 48,
        "api_key_env looks like a key, not a variable name: never put the key in the run "
        "config (the API returns it); set it in an environment variable of the learner and "
        "name that variable here",
    )


def check_llm_judge(kwargs: dict[str, Any]) -> None:
    """Refuse llm_judge kwargs that cannot work, each with the reason (no network)."""
    given = [k for k in KEY_KWARGS if k in kwargs]
    _need(
        not given,
        f"{', '.join(given)} is not taken: the API key never goes in the run config; name the "
        "learner's environment variable that holds it in api_key_env",
    )
    check_base_url(kwargs.get("base_url"))
    model = kwargs.get("model")
    _need(isinstance(model, str) and 0 < len(model) <= 200, "model is required (≤ 200 chars)")
    check_api_key_env(kwargs.get("api_key_env"))
    check_template(kwargs.get("prompt_template", DEFAULT_TEMPLATE))
    ref = kwargs.get("reference_column", "answer")
    _need(isinstance(ref, str) and bool(ref), "reference_column must be a column name")
    _check_numbers(kwargs)


def _check_numbers(kwargs: dict[str, Any]) -> None:
    ranges: dict[str, tuple[float, float, bool]] = {  # name: low, high, integer
        "max_score": (0.001, 1e6, False),
        "temperature": (0.0, 2.0, False),
        "timeout_s": (0.1, 600.0, False),
        "max_retries": (0, 10, True),
        "max_concurrency": (1, 64, True),
        "max_tokens": (1, 32_768, True),
    }
    for name, (low, high, integer) in ranges.items():
        value = kwargs.get(name)
        if name not in kwargs or (value is None and name == "max_tokens"):
            continue
        kind = "an integer" if integer else "a number"
        refused = (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or (integer and not isinstance(value, int))
            or not low <= value <= high
        )
        _need(not refused, f"{name} must be {kind} from {low:g} to {high:g} (got {value!r})")
    pick = kwargs.get("pick", "last")
    _need(pick in ("first", "last"), f"pick must be 'first' or 'last' (got {pick!r})")
