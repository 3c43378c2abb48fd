"""Our reference allocator (what ``gpudra explain`` runs) against the real 1.36 allocator.

``dra-allocate`` (``../shared/tools/dra-allocate``, or ``$DRA_ALLOCATE``) is the scheduler's
own allocator library as a command. Thousands of seeded cases (``differential_cases``: our
slices for several profiles and gates, taints, a second node, allocated claims and shares;
claims with CEL selectors, counts, All, firstAvailable, constraints, admin access, capacity
requests) go through both, and must agree:

* always on the outcome: allocated, not allocatable, or an error that aborts scheduling;
* on the devices chosen (per claim, in order: request, pool, device, admin access,
  tolerations, consumed capacity; and the configs) whenever the real allocator's choice is
  deterministic. Its search is a first fit over a fixed device order, so it is, except for
  what the scheduler cannot fix: a share's ``shareID`` is random (never compared), and a
  choice that depends on the order in which the informer lists slices. The oracle gets the
  slices in a shuffled order; when it disagrees with us on devices, the case is run again
  with the slices in the opposite order, and only a choice that changes with the order is
  excused (counted, and reported when the test fails).

``DIFFERENTIAL_CASES`` (default 5000) and ``DIFFERENTIAL_SEED`` choose the seeded cases; the
pinned ones (``pinned_cases``) run after them whatever the seed.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from gpudra.scheduling.allocation_trace import Allocation
from gpudra.scheduling.allocator import Allocator
from tests.scheduling.differential_cases import (
    NODE,
    ROOT,
    Case,
    Scenario,
    build_scenarios,
    device_classes,
    make_case,
    pinned_cases,
    write_inputs,
)

CASES = int(os.environ.get("DIFFERENTIAL_CASES", "5000"))
SEED = int(os.environ.get("DIFFERENTIAL_SEED", "29"))
PARALLEL = 2
"""Oracle processes at a time (CI has two cores; this process computes our side meanwhile)."""
CASE_TIMEOUT = 60.0
SLOW_MS = 500.0
"""A case whose search takes the real allocator longer is not compared (it would take ours
seconds); the generator keeps them rare, and the test fails if they are not."""


def _oracle() -> Path | None:
    configured = os.environ.get("DRA_ALLOCATE")
    path = Path(configured) if configured else (
        ROOT.parent / "shared" / "tools" / "dra-allocate" / "dra-allocate")
    return path if path.is_file() and os.access(path, os.X_OK) else None


ORACLE = _oracle()
pytestmark = pytest.mark.skipif(
    ORACLE is None, reason="dra-allocate (the 1.36 allocator as a command) is not at "
    "../shared/tools/dra-allocate/dra-allocate and $DRA_ALLOCATE does not name it")


# --- both sides ---------------------------------------------------------------------------

def run_oracle(classes: Path, slices: Path, case: Case) -> dict[str, Any]:
    assert ORACLE is not None
    done = subprocess.run(
        [str(ORACLE), "-node", NODE, str(classes), str(slices), "-"],
        input=case.claims_document(), capture_output=True, text=True, timeout=CASE_TIMEOUT,
        check=False)
    if done.returncode not in (0, 1):
        raise AssertionError(f"dra-allocate refused the input ({done.returncode}): "
                             f"{done.stderr.strip()}\n{case.describe()}")
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def outcome(allocation: Allocation) -> str:
    if allocation.error is not None:
        return "error"
    return "allocated" if allocation.results is not None else "unschedulable"


def _normal_results(results: Any) -> list[Any]:
    """What must match in one claim's AllocationResult (share IDs are random)."""
    devices = results.get("devices") or {}
    chosen = [(r.get("request"), r.get("driver"), r.get("pool"), r.get("device"),
               bool(r.get("adminAccess")), bool(r.get("shareID")),
               json.dumps(r.get("consumedCapacity") or {}, sort_keys=True),
               json.dumps(r.get("tolerations") or [], sort_keys=True))
              for r in devices.get("results") or []]
    configs = [json.dumps(c, sort_keys=True) for c in devices.get("config") or []]
    return [chosen, configs, json.dumps(results.get("nodeSelector"), sort_keys=True)]


def theirs_by_claim(answer: Mapping[str, Any], case: Case) -> list[Any]:
    named = answer.get("results") or {}
    return [_normal_results(named[f"default/{c['metadata']['name']}"]) for c in case.claims]


def ours_by_claim(allocation: Allocation) -> list[Any]:
    return [_normal_results(r) for r in allocation.results or []]


# --- the run ------------------------------------------------------------------------------

class Comparison:
    def __init__(self, classes: Path) -> None:
        self.classes = classes
        self.tally: Counter[str] = Counter()
        self.disagreements: list[str] = []
        self.order_dependent: list[str] = []
        self.ours_seconds = 0.0

    def check(self, case: Case, answer: dict[str, Any], allocation: Allocation) -> None:
        theirs, mine = str(answer.get("outcome")), outcome(allocation)
        self.tally[theirs] += 1
        if theirs != mine:
            self.disagreements.append(
                f"outcome: dra-allocate {theirs} ({answer.get('error', '')}), ours {mine} "
                f"({allocation.error or allocation.blocking or ''})\n{case.describe()}")
            return
        if theirs != "allocated":
            return
        expected, got = theirs_by_claim(answer, case), ours_by_claim(allocation)
        if expected == got:
            return
        again = run_oracle(self.classes, case.scenario.reversed_files[case.variant], case)
        if again.get("outcome") == "allocated" and theirs_by_claim(again, case) != expected:
            self.tally["order-dependent"] += 1
            self.order_dependent.append(case.describe())
            return
        self.disagreements.append(
            f"devices: dra-allocate {expected}\n          ours {got}\n{case.describe()}")

    def ours(self, allocator: Allocator, case: Case) -> Allocation:
        started = time.perf_counter()
        allocation = allocator.allocate(case.claims, NODE)
        self.ours_seconds += time.perf_counter() - started
        return allocation


def _cases(scenarios: list[Scenario]) -> Iterator[Case]:
    for index in range(CASES):
        yield make_case(index, SEED, scenarios)
    yield from pinned_cases(CASES, scenarios)


def test_reference_allocator_agrees_with_the_real_one(tmp_path: Path) -> None:
    started = time.perf_counter()
    scenarios = build_scenarios(SEED)
    classes_file = write_inputs(scenarios, tmp_path, SEED)
    classes = device_classes()
    comparison = Comparison(classes_file)
    pending: list[tuple[Case, Future[dict[str, Any]]]] = []
    with ThreadPoolExecutor(PARALLEL) as pool:
        # The oracle runs ahead in its processes while this thread allocates our side.
        for case in _cases(scenarios):
            pending.append((case, pool.submit(run_oracle, classes_file,
                                              case.scenario.files[case.variant], case)))
        for case, future in pending:
            answer = future.result()
            if float((answer.get("allocateMs") or {}).get("max", 0)) > SLOW_MS:
                comparison.tally["too-slow"] += 1
                continue
            allocator = Allocator(case.slices, classes, case.allocated)
            allocation = comparison.ours(allocator, case)
            comparison.check(case, answer, allocation)
    elapsed = time.perf_counter() - started
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = resource.getrusage(resource.RUSAGE_SELF)
    # CPU time does not depend on what else the machine runs: (ours + oracle) / 2 is the
    # wall time on two otherwise idle cores.
    summary = (f"{len(pending)} cases in {elapsed:.1f} s wall, CPU: this process "
               f"{own.ru_utime + own.ru_stime:.1f} s (allocating {comparison.ours_seconds:.1f} s "
               f"wall), dra-allocate {children.ru_utime + children.ru_stime:.1f} s: "
               f"{dict(comparison.tally)}")
    print(summary)
    shown = "\n\n".join(comparison.disagreements[:5])
    assert not comparison.disagreements, (
        f"{len(comparison.disagreements)} disagreement(s); {summary}\n\n{shown}")
    # A generator that drifted into one kind of answer would test little.
    assert comparison.tally["too-slow"] <= CASES // 200, summary
    for kind in ("allocated", "unschedulable", "error"):
        assert comparison.tally[kind] >= CASES // 20, summary
