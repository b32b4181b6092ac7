from __future__ import annotations

from pathlib import Path

import pytest

from senddock import defaults
from senddock.loading import load_config
from senddock.outcome import Classification, Outcome, SendResult

RETRY = Classification(Outcome.RETRY, "transient_error")


def config_with(tmp_path: Path, text: str):
    path = tmp_path / "c.yaml"
    path.write_text(text, encoding="utf-8")
    return load_config(path, environ={})


def test_default_schedule_is_one_send_plus_five_retries(tmp_path: Path):
    config = config_with(tmp_path, "retry:\n  jitter: 0\n")
    delays = [defaults.compute_backoff(attempt=n, classification=RETRY, age=0, config=config) for n in range(1, 7)]
    assert [d.delay for d in delays[:5]] == [30, 120, 480, 1800, 3600]
    assert delays[5].stop and delays[5].reason == "retries_exhausted"


def test_max_retries_beyond_the_schedule_repeats_its_last_delay(tmp_path: Path):
    config = config_with(tmp_path, "retry:\n  schedule: [1s, 5s]\n  max_retries: 4\n  jitter: 0\n")
    delays = [defaults.compute_backoff(attempt=n, classification=RETRY, age=0, config=config) for n in range(1, 6)]
    assert [d.delay for d in delays[:4]] == [1, 5, 5, 5]
    assert delays[4].stop


def test_jitter_stays_within_its_fraction(tmp_path: Path):
    config = config_with(tmp_path, "retry:\n  jitter: 0.1\n")
    delays = {defaults.compute_backoff(attempt=1, classification=RETRY, age=0, config=config).delay for _ in range(200)}
    assert min(delays) >= 27 and max(delays) <= 33
    assert len(delays) > 1


def test_server_requested_wait_is_honoured(tmp_path: Path):
    config = config_with(tmp_path, "retry:\n  jitter: 0\n")
    asked = Classification(Outcome.RETRY, "try_later", retry_after=600)
    assert defaults.compute_backoff(attempt=1, classification=asked, age=0, config=config).delay == 600


def test_max_age_gives_up(tmp_path: Path):
    config = config_with(tmp_path, "retry:\n  jitter: 0\n  max_age: 10m\n")
    assert defaults.compute_backoff(attempt=3, classification=RETRY, age=60, config=config).delay == 480
    late = defaults.compute_backoff(attempt=3, classification=RETRY, age=200, config=config)
    assert late.stop and late.reason == "expired"


@pytest.mark.parametrize("flag", ["throttled", "relay_trouble"])
def test_throttling_and_relay_trouble_never_use_up_max_retries(tmp_path: Path, flag: str):
    config = config_with(tmp_path, "retry:\n  jitter: 0\n  max_retries: 1\n")
    deferral = Classification(Outcome.RETRY, "throttled", **{flag: True})
    # Far past max_retries, the delay follows the schedule by the deferrals in a row...
    delays = [defaults.compute_backoff(attempt=1, classification=deferral, age=0, config=config, deferrals=n).delay
              for n in range(1, 8)]
    assert delays == [30, 120, 480, 1800, 3600, 3600, 3600]
    # ... and only retry.max_age (5 days by default) ends them.
    assert config.retry.max_age == 5 * 86400
    expired = defaults.compute_backoff(attempt=1, classification=deferral, age=5 * 86400, config=config, deferrals=50)
    assert expired.stop and expired.reason == "expired"


@pytest.mark.parametrize(
    ("result", "outcome", "reason"),
    [
        (SendResult("smtp", ok=True), Outcome.SENT, "sent"),
        (SendResult.from_exception("smtp", ConnectionRefusedError("refused")), Outcome.RETRY, "transient_error"),
        (SendResult.from_exception("smtp", TimeoutError()), Outcome.RETRY, "transient_error"),
        (SendResult.from_exception("x", KeyError("bug")), Outcome.FAIL, "plugin_error"),
    ],
)
def test_default_classification(result: SendResult, outcome: Outcome, reason: str):
    verdict = defaults.classify_result(result=result)
    assert (verdict.outcome, verdict.reason) == (outcome, reason)


def test_captured_exception_keeps_its_type_in_the_text():
    assert SendResult.from_exception("smtp", KeyError("x")).text == "KeyError: 'x'"
    assert SendResult.from_exception("smtp", TimeoutError()).text == "TimeoutError"
