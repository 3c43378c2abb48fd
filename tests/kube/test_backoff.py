"""Capped exponential back-off with jitter: the publisher's retry pacing."""

from __future__ import annotations

import pytest

from gpudra.kube.backoff import MAX_RETRY_AFTER, Backoff


def fixed(value: float):
    return lambda: value


def test_doubles_up_to_the_cap_without_jitter_at_the_midpoint():
    backoff = Backoff(initial=0.1, factor=2, cap=1.0, jitter=0.2, random=fixed(0.5))
    delays = [round(backoff.next(), 6) for _ in range(7)]
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    assert backoff.attempts == 7


@pytest.mark.parametrize(("draw", "factor"), [(0.0, 0.8), (0.999999, 1.2)])
def test_jitter_stays_within_its_band(draw, factor):
    backoff = Backoff(initial=1.0, cap=10.0, jitter=0.2, random=fixed(draw))
    assert backoff.next() == pytest.approx(factor, rel=1e-5)


def test_reset_starts_over_and_fresh_copies_parameters():
    backoff = Backoff(initial=0.5, cap=4.0, random=fixed(0.5))
    backoff.next()
    backoff.next()
    backoff.reset()
    assert backoff.next() == pytest.approx(0.5)
    copy = backoff.fresh()
    assert copy.attempts == 0 and copy.cap == 4.0 and copy.initial == 0.5


def test_retry_after_is_honoured_but_bounded():
    backoff = Backoff(initial=0.1, random=fixed(0.5))
    assert backoff.honouring(3.0) == pytest.approx(3.0)
    assert backoff.honouring(None) == pytest.approx(0.2)
    assert backoff.honouring(10_000) == pytest.approx(MAX_RETRY_AFTER)


def test_at_cap_for_failures_that_retrying_soon_cannot_fix():
    backoff = Backoff(initial=0.1, cap=10.0, random=fixed(0.5))
    assert backoff.at_cap() == pytest.approx(10.0)


@pytest.mark.parametrize("kwargs", [{"initial": 0}, {"initial": 20, "cap": 10},
                                    {"factor": 0.5}, {"jitter": 1.0}])
def test_nonsense_parameters_are_refused(kwargs):
    with pytest.raises(ValueError):
        Backoff(**kwargs)
