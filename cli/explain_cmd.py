"""``gpudra explain``: would these claims be allocated, on which node and devices, and why not.

The cluster is either simulated (``--simulate PROFILE --nodes N``: N identical nodes) or
read through the kubeconfig kubectl would use (DeviceClasses, ResourceSlices, allocated
claims, node labels).
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudra.cli.mig_flags import add_mig_flags
from gpudra.cli.options import CliError, add_simulation_flags, env
from gpudra.cli.output import EXIT_STATUS_HELP, UsageError, add_output_flag, emit, table

if TYPE_CHECKING:
    from gpudra.kube.kubeconfig import ClusterAccess
    from gpudra.scheduling.explain import Explanation

# The allocator, CEL, YAML and the simulated node are imported by the functions that use
# them: `explain --help` and `gpudra --help` then start in a fraction of the time.

DEFAULT_DRIVER = "gpu.nvidia.com"


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "explain", help="say whether (and where) the scheduler would allocate a claim",
        description="Run the scheduler's allocation for the claims in FILE (ResourceClaim, "
                    "ResourceClaimTemplate, or a Pod with the templates it uses; DeviceClass "
                    "documents override the defaults) against simulated nodes or a cluster, "
                    "and explain the choice or the refusal device by device. Without "
                    "--simulate, the cluster is the one kubectl would use.",
        epilog=EXIT_STATUS_HELP)
    parser.add_argument("files", metavar="FILE", nargs="+", type=Path,
                        help="YAML (possibly multi-document), a folder of it as kubectl apply "
                             "-f reads one, or - for standard input")
    add_simulation_flags(parser)
    parser.add_argument("--nodes", type=int, default=1, metavar="N",
                        help="with --simulate: N identical nodes <profile>-0 … <profile>-N-1")
    parser.add_argument("--kubeconfig", type=Path, metavar="FILE",
                        help="the cluster to read DeviceClasses, ResourceSlices and "
                             "allocations from (default: KUBECONFIG, else ~/.kube/config, "
                             "else in-cluster)")
    parser.add_argument("--context", help="the kubeconfig context to use")
    parser.add_argument("-n", "--namespace",
                        help="namespace of input objects that name none (default: the "
                             "context's, as kubectl apply)")
    parser.add_argument("--node", action="append", metavar="NAME",
                        help="only consider this node (repeatable)")
    parser.add_argument("--driver-name", default=env("DRIVER_NAME", DEFAULT_DRIVER),
                        help="DRA driver name (env DRIVER_NAME; default gpu.nvidia.com)")
    parser.add_argument("--feature-gates", default=env("FEATURE_GATES", ""),
                        help="comma-separated Name=true|false for the simulated node")
    parser.add_argument("--shareable-gpus", default=env("SHAREABLE_GPUS", "none"),
                        help="GPUs of the simulated node that publish a shared device: all, "
                             "none, or minors/UUIDs (as the node daemon's flag)")
    add_mig_flags(parser)  # the simulated node's dynamic MIG, as the node daemon's flags
    add_output_flag(parser, "every node's allocation and trace")
    parser.set_defaults(run=run)


@dataclass
class Cluster:
    """What the allocator needs to know about a cluster."""

    slices: list[dict[str, Any]]
    device_classes: list[dict[str, Any]]
    nodes: list[str]
    allocations: list[dict[str, Any]] = field(default_factory=list)
    labels: dict[str, dict[str, str]] = field(default_factory=dict)


def read_documents(path: Path) -> list[Any]:
    from gpudra.cli import manifests

    return manifests.read_documents(path)


def deploy_classes(driver: str) -> list[dict[str, Any]]:
    """The chart's DeviceClasses when they are there and fit the driver name, else built-ins."""
    import yaml

    from gpudra.cli import package_data
    from gpudra.scheduling.explain import default_device_classes

    found: list[dict[str, Any]] = []
    if driver == DEFAULT_DRIVER:
        for path in package_data.device_class_files():
            try:
                found.extend(d for d in yaml.safe_load_all(path.read_text())
                             if isinstance(d, dict) and d.get("kind") == "DeviceClass")
            except yaml.YAMLError:
                return default_device_classes(driver)  # a Helm template, not plain YAML
    return found or default_device_classes(driver)


def _renamed(slices: list[dict[str, Any]], old: str, new: str) -> Iterator[dict[str, Any]]:
    """The same pool for another node: new names, shared (read-only) device dicts."""
    for obj in slices:
        name = str(obj["metadata"]["name"])
        spec = dict(obj["spec"])
        spec["nodeName"] = new
        spec["pool"] = {**spec["pool"], "name": new}
        yield {**obj, "metadata": {**obj["metadata"], "name": new + name[len(old):]},
               "spec": spec}


def simulated_cluster(args: argparse.Namespace) -> Cluster:
    from gpudra.cli.explain_compute_domains import simulated_slices
    from gpudra.cli.inventory_cmd import collect_devices
    from gpudra.controller.slices import build_slices
    from gpudra.scheduling.explain_compute_domain import device_classes as domain_classes

    if args.nodes < 1:
        raise UsageError("--nodes must be at least 1")
    devices = collect_devices(args)
    nodes = [f"{args.simulate}-{i}" for i in range(args.nodes)]
    # Building slices costs milliseconds per node; identical nodes share one build.
    first = build_slices(devices, driver=args.driver_name, node_name=nodes[0])
    classes = deploy_classes(args.driver_name)
    # A GB200-class profile: the compute-domain pool gpudra compute-domain-node publishes.
    domains = simulated_slices(args, nodes[0])
    if domains:
        first = [*first, *domains]
        classes += [c for c in domain_classes()
                    if c["metadata"]["name"] not in {d["metadata"]["name"] for d in classes}]
    slices = list(first)
    for node in nodes[1:]:
        slices.extend(_renamed(first, nodes[0], node))
    return Cluster(slices, classes, nodes)


def cluster_from_kubeconfig(access: ClusterAccess) -> Cluster:
    from gpudra.kube.raw_api import DEVICE_CLASSES, NODES, RESOURCE_CLAIMS, RESOURCE_SLICES

    slices, classes, claims, node_objects = read_cluster(
        access, [RESOURCE_SLICES, DEVICE_CLASSES, RESOURCE_CLAIMS, NODES])
    labels = {str(n["metadata"]["name"]): dict(n["metadata"].get("labels") or {})
              for n in node_objects}
    nodes = sorted(labels) or sorted({str(s["spec"]["nodeName"]) for s in slices
                                      if (s.get("spec") or {}).get("nodeName")})
    allocated = [c for c in claims if (c.get("status") or {}).get("allocation")]
    return Cluster(slices, classes, nodes, allocated, labels)


def read_cluster(access: ClusterAccess, resources: list[Any]) -> list[list[dict[str, Any]]]:
    """Whole lists through the daemon's own loader and transport; a failure is a
    :class:`CliError` (exit status 1)."""
    from gpudra.kube.errors import ApiCallError, Unreachable
    from gpudra.kube.reads import read_lists

    try:
        return read_lists(access, resources)
    except Unreachable as exc:
        raise CliError(f"cannot reach the cluster ({access.source}): {exc.message}") from exc
    except ApiCallError as exc:
        raise CliError(f"reading the cluster failed: {exc}") from exc


def _with_overrides(base: list[dict[str, Any]],
                    overrides: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_name: dict[str, dict[str, Any]] = {
        str((c.get("metadata") or {}).get("name")): c for c in base}
    for device_class in overrides:
        by_name[str((device_class.get("metadata") or {}).get("name"))] = device_class
    return list(by_name.values())


def _selected_nodes(cluster: Cluster, wanted: list[str] | None) -> list[str]:
    if not wanted:
        return cluster.nodes
    unknown = [n for n in wanted if n not in cluster.nodes]
    if unknown:
        raise UsageError(f"--node: unknown node(s) {', '.join(unknown)}")
    return [n for n in cluster.nodes if n in wanted]


def _refuse_invalid(path: Path, documents: list[Any], driver: str) -> None:
    """Objects the apiserver would refuse are not explained (CEL problems are: that is
    what explain is for)."""
    from gpudra.scheduling.validate import objects, validate_object

    problems = [f"  {path}:{p.path}: {p.message}" for obj in objects(documents)
                for p in validate_object(obj, driver=driver) if p.structural]
    if problems:
        raise CliError("the apiserver would refuse this input (see also gpudra validate):\n"
                       + "\n".join(problems))


@contextmanager
def _without_gc_pauses() -> Iterator[None]:
    """Allocating on a thousand nodes makes millions of small, mostly acyclic objects; the
    cyclic GC would scan them thousands of times (measured: more than half the run time)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _cluster_access(args: argparse.Namespace) -> ClusterAccess | None:
    """Where the cluster is, found as kubectl finds it; ``None`` with ``--simulate``."""
    if args.simulate:
        if args.kubeconfig or args.context:
            raise UsageError("--simulate reads no cluster: give it, or --kubeconfig/--context")
        return None
    from gpudra.kube.kubeconfig import KubeconfigError, resolve

    try:
        return resolve(args.kubeconfig, context=args.context, namespace=args.namespace)
    except KubeconfigError as exc:
        raise UsageError(f"{exc} (or explain on simulated nodes: --simulate PROFILE)") from exc


def _default_namespace(documents: list[Any], namespace: str | None) -> None:
    """Claims, templates and pods that name no namespace get this one, as kubectl apply -n."""
    if not namespace:
        return
    from gpudra.scheduling.validate import objects, pod_spec

    for obj in objects(documents):
        if obj.get("kind") in ("ResourceClaim", "ResourceClaimTemplate") or pod_spec(obj):
            meta = obj.get("metadata")
            if isinstance(meta, dict) and not meta.get("namespace"):
                meta["namespace"] = namespace


def _node_lines(explanation: Explanation) -> list[str]:
    """``-o wide``: every node's outcome, one row each."""
    rows = []
    for allocation in explanation.allocations:
        devices = ", ".join(f"{item['request']} -> {item['device']}"
                            for result in allocation.results or []
                            for item in result["devices"]["results"])
        outcome = devices if allocation.allocatable else (
            allocation.error or allocation.blocking or "not allocatable")
        rows.append([allocation.node, "yes" if allocation.allocatable else "no", outcome])
    return ["  " + line for line in table(["NODE", "FITS", "DEVICES OR REASON"], rows)]


def print_explanations(explanations: list[Explanation], fmt: str) -> None:
    from gpudra.scheduling.explain_output import render_table, to_json

    if fmt in ("json", "yaml"):
        document: Mapping[str, Any] = (to_json(explanations[0]) if len(explanations) == 1
                                       else {"items": [to_json(e) for e in explanations]})
        emit(document, fmt)
        return
    for i, explanation in enumerate(explanations):
        if i:
            sys.stdout.write("\n")
        lines = render_table(explanation)
        if fmt == "wide":
            lines[-1:-1] = _node_lines(explanation)
        sys.stdout.write("\n".join(lines) + "\n")


def run(args: argparse.Namespace) -> int:
    from gpudra.cli import manifests
    from gpudra.scheduling.allocator import Allocator
    from gpudra.scheduling.explain import explain
    from gpudra.scheduling.explain_compute_domain import domain_templates
    from gpudra.scheduling.explain_subjects import ExplainError, subjects

    inputs = [(path, read_documents(path)) for path in manifests.expand(args.files)]
    documents = [document for _, docs in inputs for document in docs]
    access = _cluster_access(args)
    _default_namespace(documents, access.namespace if access else args.namespace)
    for path, docs in inputs:
        _refuse_invalid(path, docs, args.driver_name)
    try:
        documents += domain_templates(documents)  # the channel templates of ComputeDomains
        found, class_docs = subjects(documents)
    except ExplainError as exc:
        raise UsageError(f"{', '.join(str(p) for p, _ in inputs)}: {exc}") from exc
    cluster = simulated_cluster(args) if access is None else cluster_from_kubeconfig(access)
    nodes = _selected_nodes(cluster, args.node)
    classes = _with_overrides(cluster.device_classes, class_docs)
    # Again, now that the cluster's classes say which extended resources DRA provides.
    found, _ = subjects(documents, classes)
    with _without_gc_pauses():
        allocator = Allocator(cluster.slices, classes, cluster.allocations)
        try:
            explanations = [explain(s, allocator, nodes, cluster.labels,
                                    driver=args.driver_name) for s in found]
        except ExplainError as exc:
            raise CliError(str(exc)) from exc
    print_explanations(explanations, args.output)
    return 0 if all(e.ok for e in explanations) else 1
