"""Counters, gauges and histograms with labels, and Prometheus' text exposition format.

The node daemon's own Prometheus client, in place of ``prometheus_client``, whose
``__init__`` also imports its HTTP and WSGI servers, push-gateway client and gzip support
(``http.server``, ``wsgiref``, ``urllib.request`` …): ~2 MiB of the idle daemon's resident
memory (issue 14), for a daemon that serves ``/metrics`` from its own probe server. What
this writes is what ``prometheus_client`` writes for the same metrics: the names (``_total``,
``_created``, ``_bucket``/``_count``/``_sum``), the HELP and TYPE lines, label and number
formatting, and the default process, ``python_info`` and garbage-collector metrics; the
tests hold it to that package's own parser and output, so dashboards and alerts see no change.
Only what the daemon uses is here (no summaries, no ``time()`` helpers, no multiprocess mode).
"""

from __future__ import annotations

import bisect
import gc
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Generic, TypeVar

CONTENT_TYPE_LATEST: Final = "text/plain; version=1.0.0; charset=utf-8"
"""What prometheus_client (0.22 and later) sends with the same body: text format 1.0.0, which
for names of letters, digits and underscores, as all of ours are, is format 0.0.4."""
_INF: Final = float("inf")


@dataclass
class Family:
    """One metric family as collected: ``samples`` are (name, labels, value)."""

    name: str
    documentation: str
    type: str
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)


class Registry:
    """The metrics written to ``/metrics``, in the order they were registered."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._collectors: list[Callable[[], Iterable[Family]]] = []
        self._names: set[str] = set()

    def register(self, collect: Callable[[], Iterable[Family]], names: Sequence[str]) -> None:
        """Add a collector that writes the families ``names`` (each name only once)."""
        with self._lock:
            clash = self._names.intersection(names)
            if clash:
                raise ValueError(f"metrics registered twice: {sorted(clash)}")
            self._names.update(names)
            self._collectors.append(collect)

    def collect(self) -> Iterator[Family]:
        with self._lock:
            collectors = list(self._collectors)
        for collect in collectors:
            yield from collect()

    def get_sample_value(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        """The value of one sample, or None if there is no such sample (for tests)."""
        wanted = labels or {}
        for family in self.collect():
            for sample, sample_labels, value in family.samples:
                if sample == name and sample_labels == wanted:
                    return value
        return None


def _created_series() -> bool:
    # prometheus_client's switch, honoured the same way.
    return os.environ.get("PROMETHEUS_DISABLE_CREATED_SERIES", "").lower() not in (
        "true", "1", "t")


class _Value:
    """One time series' value (a counter's or a gauge's), guarded by its metric's lock."""

    __slots__ = ("_lock", "created", "value")

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self.value = 0.0
        self.created = time.time()


class CounterChild(_Value):
    __slots__ = ()

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError(f"a counter only goes up: inc({amount})")
        with self._lock:
            self.value += amount


class GaugeChild(_Value):
    __slots__ = ()

    def set(self, value: float) -> None:
        with self._lock:
            self.value = float(value)

    def inc(self, amount: float = 1.0) -> None:
        with self._lock:
            self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        with self._lock:
            self.value -= amount


class HistogramChild:
    """Counts per bucket (not cumulative: they are summed when collected), and the sum."""

    __slots__ = ("_bounds", "_lock", "counts", "created", "sum")

    def __init__(self, lock: threading.Lock, bounds: tuple[float, ...]) -> None:
        self._lock = lock
        self._bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        # The first bucket whose upper bound is >= amount (``le``); +Inf catches the rest.
        index = bisect.bisect_left(self._bounds, amount)
        with self._lock:
            if index < len(self.counts):
                self.counts[index] += 1
            self.sum += amount


C = TypeVar("C")


class _Metric(Generic[C]):
    """A metric family: one child per combination of label values (one child, for the
    empty combination, when it has no labels)."""

    TYPE: str

    def __init__(self, name: str, documentation: str, labelnames: Iterable[str] = (), *,
                 registry: Registry | None = None) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._lock = threading.Lock()
        self._children: dict[tuple[str, ...], C] = {}
        if not self.labelnames:
            self._children[()] = self._child()
        (REGISTRY if registry is None else registry).register(self._collect, self._names())

    def _child(self) -> C:
        raise NotImplementedError

    def _names(self) -> list[str]:
        return [self.name]

    def labels(self, *values: object, **named: object) -> C:
        """The child for these label values (created at the first call), given in
        ``labelnames`` order or by name."""
        if named:
            if values or set(named) != set(self.labelnames):
                raise ValueError(f"{self.name}: label values for {self.labelnames} expected, "
                                 f"got {values} {named}")
            values = tuple(named[name] for name in self.labelnames)
        if len(values) != len(self.labelnames) or not self.labelnames:
            raise ValueError(f"{self.name}: {len(self.labelnames)} label values expected "
                             f"({', '.join(self.labelnames)}), got {len(values)}")
        key = tuple(str(value) for value in values)
        child = self._children.get(key)
        if child is None:
            with self._lock:
                child = self._children.setdefault(key, self._child())
        return child

    def remove(self, *values: object) -> None:
        """Drop the child of these label values; KeyError if it was never created."""
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name}: {len(self.labelnames)} label values expected")
        with self._lock:
            del self._children[tuple(str(value) for value in values)]

    def _only(self) -> C:
        if self.labelnames:
            raise ValueError(f"{self.name} has labels ({', '.join(self.labelnames)}): "
                             "use labels()")
        return self._children[()]

    def _items(self) -> list[tuple[dict[str, str], C]]:
        with self._lock:
            return [(dict(zip(self.labelnames, key, strict=True)), child)
                    for key, child in self._children.items()]

    def _collect(self) -> list[Family]:
        raise NotImplementedError


class Counter(_Metric[CounterChild]):
    """Written as ``<name>_total`` (a trailing ``_total`` in ``name`` is dropped first),
    with ``<name>_created``."""

    def __init__(self, name: str, documentation: str, labelnames: Iterable[str] = (), *,
                 registry: Registry | None = None) -> None:
        super().__init__(name.removesuffix("_total"), documentation, labelnames,
                         registry=registry)

    def _child(self) -> CounterChild:
        return CounterChild(self._lock)

    def _names(self) -> list[str]:
        return [self.name, f"{self.name}_total", f"{self.name}_created"]

    def inc(self, amount: float = 1.0) -> None:
        self._only().inc(amount)

    def _collect(self) -> list[Family]:
        items = self._items()
        total = Family(f"{self.name}_total", self.documentation, "counter",
                       [(f"{self.name}_total", labels, child.value) for labels, child in items])
        if not items or not _created_series():  # no empty _created family, as upstream
            return [total]
        return [total, Family(f"{self.name}_created", self.documentation, "gauge",
                              [(f"{self.name}_created", labels, child.created)
                               for labels, child in items])]


class Gauge(_Metric[GaugeChild]):
    def _child(self) -> GaugeChild:
        return GaugeChild(self._lock)

    def set(self, value: float) -> None:
        self._only().set(value)

    def inc(self, amount: float = 1.0) -> None:
        self._only().inc(amount)

    def dec(self, amount: float = 1.0) -> None:
        self._only().dec(amount)

    def _collect(self) -> list[Family]:
        return [Family(self.name, self.documentation, "gauge",
                       [(self.name, labels, child.value) for labels, child in self._items()])]


DEFAULT_BUCKETS: Final = (.005, .01, .025, .05, .075, .1, .25, .5, .75, 1.0, 2.5, 5.0, 7.5, 10.0,
                          _INF)


class Histogram(_Metric[HistogramChild]):
    """Buckets are upper bounds (``le``); +Inf is added when missing."""

    def __init__(self, name: str, documentation: str, labelnames: Iterable[str] = (), *,
                 buckets: Sequence[float] = DEFAULT_BUCKETS,
                 registry: Registry | None = None) -> None:
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds) or not bounds:
            raise ValueError(f"{name}: buckets must be given in increasing order")
        if bounds[-1] != _INF:
            bounds.append(_INF)
        self._bounds = tuple(bounds)
        if "le" in labelnames:
            raise ValueError(f"{name}: a histogram cannot have a label named le")
        super().__init__(name, documentation, labelnames, registry=registry)

    def _child(self) -> HistogramChild:
        return HistogramChild(self._lock, self._bounds)

    def _names(self) -> list[str]:
        return [self.name, *(f"{self.name}_{s}" for s in ("bucket", "count", "sum", "created"))]

    def observe(self, amount: float) -> None:
        self._only().observe(amount)

    def _collect(self) -> list[Family]:
        family = Family(self.name, self.documentation, "histogram")
        created = Family(f"{self.name}_created", self.documentation, "gauge")
        for labels, child in self._items():
            with self._lock:
                counts, total = list(child.counts), child.sum
            running = 0
            for bound, count in zip(self._bounds, counts, strict=True):
                running += count
                family.samples.append((f"{self.name}_bucket",
                                       {**labels, "le": _go_float(bound)}, float(running)))
            family.samples.append((f"{self.name}_count", labels, float(running)))
            family.samples.append((f"{self.name}_sum", labels, total))
            created.samples.append((f"{self.name}_created", labels, child.created))
        return [family, created] if created.samples and _created_series() else [family]


def _gc_families() -> list[Family]:
    names = (("python_gc_objects_collected_total", "Objects collected during gc", "collected"),
             ("python_gc_objects_uncollectable_total", "Uncollectable objects found during GC",
              "uncollectable"),
             ("python_gc_collections_total", "Number of times this generation was collected",
              "collections"))
    stats = gc.get_stats()
    return [Family(name, doc, "counter",
                   [(name, {"generation": str(gen)}, float(stat[key]))
                    for gen, stat in enumerate(stats)])
            for name, doc, key in names]


def _python_info() -> list[Family]:
    import platform  # already loaded by the daemon's other imports; here for the CLI's sake

    major, minor, patchlevel = platform.python_version_tuple()
    labels = {"version": platform.python_version(),
              "implementation": platform.python_implementation(),
              "major": major, "minor": minor, "patchlevel": patchlevel}
    return [Family("python_info", "Python platform information", "gauge",
                   [("python_info", labels, 1.0)])]


class _Process:
    """``process_*`` from ``/proc``, as prometheus_client's process collector reads them."""

    def __init__(self) -> None:
        self._ticks = os.sysconf("SC_CLK_TCK")
        self._pagesize = os.sysconf("SC_PAGE_SIZE")
        try:
            with Path("/proc/stat").open("rb") as stat:
                self._btime = next((float(line.split()[1]) for line in stat
                                    if line.startswith(b"btime ")), 0.0)
        except OSError:
            self._btime = 0.0

    def __call__(self) -> list[Family]:
        if not self._btime:
            return []
        families = []
        try:
            parts = Path("/proc/self/stat").read_bytes().split(b")")[-1].split()
            families += [
                Family("process_virtual_memory_bytes", "Virtual memory size in bytes.", "gauge",
                       [("process_virtual_memory_bytes", {}, float(parts[20]))]),
                Family("process_resident_memory_bytes", "Resident memory size in bytes.",
                       "gauge", [("process_resident_memory_bytes", {},
                                  float(parts[21]) * self._pagesize)]),
                Family("process_start_time_seconds",
                       "Start time of the process since unix epoch in seconds.", "gauge",
                       [("process_start_time_seconds", {},
                         float(parts[19]) / self._ticks + self._btime)]),
                Family("process_cpu_seconds_total",
                       "Total user and system CPU time spent in seconds.", "counter",
                       [("process_cpu_seconds_total", {},
                         float(parts[11]) / self._ticks + float(parts[12]) / self._ticks)]),
            ]
        except OSError:
            pass
        try:
            with Path("/proc/self/limits").open("rb") as limits:
                max_fds = next(float(line.split()[3]) for line in limits
                               if line.startswith(b"Max open file"))
            open_fds = sum(1 for _ in Path("/proc/self/fd").iterdir())
            families += [
                Family("process_open_fds", "Number of open file descriptors.", "gauge",
                       [("process_open_fds", {}, float(open_fds))]),
                Family("process_max_fds", "Maximum number of open file descriptors.", "gauge",
                       [("process_max_fds", {}, max_fds)]),
            ]
        except (OSError, StopIteration):
            pass
        return families


REGISTRY: Final = Registry()
REGISTRY.register(_gc_families, ["python_gc_objects_collected", "python_gc_objects_uncollectable",
                                 "python_gc_collections"])
REGISTRY.register(_python_info, ["python_info"])
if sys.platform == "linux":
    REGISTRY.register(_Process(), ["process_virtual_memory_bytes",
                                   "process_resident_memory_bytes", "process_start_time_seconds",
                                   "process_cpu_seconds_total", "process_open_fds",
                                   "process_max_fds"])


def _go_float(value: float) -> str:
    """A number as Go (and so Prometheus, and prometheus_client) writes it: ``1.0``,
    ``1e+07``, ``+Inf``."""
    if value == _INF:
        return "+Inf"
    if value == -_INF:
        return "-Inf"
    if math.isnan(value):
        return "NaN"
    text = repr(float(value))
    dot = text.find(".")
    if value > 0 and dot > 6:  # Go switches to an exponent sooner than Python does
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


def _label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def generate_latest(registry: Registry = REGISTRY) -> bytes:
    """Every registered metric in the text format (see :data:`CONTENT_TYPE_LATEST`)."""
    lines = []
    for family in registry.collect():
        doc = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
        lines.append(f"# HELP {family.name} {doc}\n# TYPE {family.name} {family.type}\n")
        for name, labels, value in family.samples:
            if labels:
                text = ",".join(f'{key}="{_label_value(labels[key])}"' for key in sorted(labels))
                lines.append(f"{name}{{{text}}} {_go_float(value)}\n")
            else:
                lines.append(f"{name} {_go_float(value)}\n")
    return "".join(lines).encode()
