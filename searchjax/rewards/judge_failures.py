"""When judge failures stop a run.

A judge-backed reward (CCS, the Constitutional Judge, a composition with EviBack's Teacher) never turns a
failed judge request into a score: the group gets zero advantages and a counter (see each reward's
docstring). That is right for a few failures, but a dead endpoint would make every group zero and the run
would go on training on nothing. So the RewardFn the loop calls checks each step's failure rate, the
failed requests (after the backend's retries and the correction round) over the distinct requests asked,
and stops the run above the config's threshold.
"""

from __future__ import annotations


class JudgeFailureRateExceeded(RuntimeError):
    """More than the configured fraction of one step's judge requests failed: the run stops."""


def check_failure_rate(failed: int, requests: int, max_rate: float, what: str) -> None:
    """Raise JudgeFailureRateExceeded when failed / requests > max_rate (never when no request was made).

    what: the config section that sets max_rate, named in the message (e.g. "config.cj.max_failure_rate").
    """
    if not 0.0 <= max_rate <= 1.0:
        raise ValueError(f"{what}={max_rate} must be in [0, 1]")
    if requests and failed / requests > max_rate:
        raise JudgeFailureRateExceeded(
            f"{failed} of {requests} judge requests of this step failed ({failed / requests:.0%}), above "
            f"{what}={max_rate}: check the judge endpoint (the audit file has each error), or raise {what}")
