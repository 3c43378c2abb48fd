"""``GPUDRA_FAIL_AT``: a named point raises, every time or the first n times."""

from __future__ import annotations

from collections import Counter

import pytest

from gpudra.driver import faults

POINT = "publisher:after-round"


@pytest.fixture(autouse=True)
def fresh_counts(monkeypatch):
    monkeypatch.setattr(faults, "_failures", Counter())


def test_unset_does_nothing(monkeypatch):
    monkeypatch.delenv(faults.FAIL_ENV, raising=False)
    faults.fail_point(POINT)


def test_another_point_does_nothing(monkeypatch):
    monkeypatch.setenv(faults.FAIL_ENV, "somewhere:else")
    faults.fail_point(POINT)


def test_every_time(monkeypatch):
    monkeypatch.setenv(faults.FAIL_ENV, POINT)
    for _ in range(3):
        with pytest.raises(faults.InjectedFault, match="injected fault at publisher:after-round"):
            faults.fail_point(POINT)


def test_the_first_n_times(monkeypatch):
    monkeypatch.setenv(faults.FAIL_ENV, f"{POINT}=2")
    for _ in range(2):
        with pytest.raises(faults.InjectedFault):
            faults.fail_point(POINT)
    faults.fail_point(POINT)


def test_a_typo_in_a_point_name_is_refused():
    with pytest.raises(ValueError, match="unknown fail point"):
        faults.fail_point("publisher:after-rnd")
