"""The import graph of tandem's parts (its subpackages and top-level modules) has no cycle (pure: parses
the sources, imports nothing)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "include" / "tandem"
KNOWN_CYCLES: list[set[str]] = []
"""Cycles not undone yet (none: the last, plans <-> runtime, went when the run loop began loading plan
modules by name through tandem.runtime.plan_api). A cycle that is undone is taken off this list."""


def part_of(module: str) -> str:
    """``tandem.runtime.sinks`` -> ``tandem.runtime``; ``tandem.cli`` -> ``tandem.cli``."""
    return ".".join(module.split(".")[:2])


def modules(package: Path) -> dict[str, Path]:
    found = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported(path: Path, known: dict[str, Path]) -> Iterator[str]:
    """Every tandem module ``path`` imports, at the top or inside a function (a lazy import is a dependency too)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("tandem"):
            yield node.module
            yield from (f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in known)
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("tandem"))


def part_graph(package: Path) -> dict[str, set[str]]:
    known = modules(package)
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        for target in imported(path, known):
            source, sink = part_of(name), part_of(target)
            if source != sink and sink != "tandem":
                graph.setdefault(source, set()).add(sink)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with more than one part (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(set(graph) | {n for targets in graph.values() for n in targets}):
        if node not in index:
            visit(node)
    return found


def test_cycles_are_found() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_parts_of_tandem_import_each_other_without_a_cycle() -> None:
    graph = part_graph(PACKAGE)
    assert {"tandem.config", "tandem.store", "tandem.supervisor"} <= set(graph)
    found = sorted(cycles(graph), key=sorted)
    assert found == KNOWN_CYCLES, (
        "a new import cycle between tandem's parts (or a known one undone: take it off KNOWN_CYCLES): "
        + "; ".join(" <-> ".join(sorted(c)) for c in found))


LOWER_THAN = {
    # the runtime runs inside a Spark job: it loads plans by name and knows nothing of who launched it
    "tandem.runtime": {"tandem.supervisor", "tandem.airflow", "tandem.presenter", "tandem.cli", "tandem.demo",
                       "tandem.snapshots", "tandem.plans"},
    # output kinds are what the runtime publishes through and snapshots read through
    "tandem.outputs": {"tandem.runtime", "tandem.supervisor", "tandem.airflow", "tandem.presenter", "tandem.cli",
                       "tandem.snapshots", "tandem.plans"},
    # source kinds are what the runtime reads through and producers, the receiver, the supervisor, backfills,
    # restores and resets ask; they import no pyspark at the top (test_sources_import_no_pyspark)
    "tandem.sources": {"tandem.runtime", "tandem.outputs", "tandem.batch", "tandem.snapshots", "tandem.supervisor",
                       "tandem.airflow", "tandem.presenter", "tandem.cli", "tandem.plans", "tandem.producer",
                       "tandem.receiver", "tandem.plan_reset"},
    # the messaging layer's client, below the source kinds (and output relays) that use it
    "tandem.messaging": {"tandem.sources", "tandem.runtime", "tandem.outputs", "tandem.batch", "tandem.snapshots",
                         "tandem.supervisor"},
    # checkpoint files, below everything that cuts, checks or recovers them
    "tandem.checkpoints": {"tandem.runtime", "tandem.supervisor", "tandem.snapshots", "tandem.outputs",
                           "tandem.store", "tandem.sources"},
    "tandem.store": {"tandem.runtime", "tandem.outputs", "tandem.supervisor", "tandem.airflow", "tandem.presenter",
                     "tandem.snapshots", "tandem.plans"},
    # declarations and configuration sit below all I/O
    **{part: {"tandem.store", "tandem.lake", "tandem.runtime", "tandem.outputs", "tandem.supervisor", "tandem.airflow",
              "tandem.presenter", "tandem.snapshots", "tandem.plans", "tandem.checkpoints", "tandem.sources"}
       for part in ("tandem.config", "tandem.declarations", "tandem.names", "tandem.errors", "tandem.redaction",
                    "tandem.layout")},
}
"""Parts that must not import the parts listed (directly: a cycle-free graph keeps it so transitively too)."""


def test_lower_layers_do_not_import_higher_ones() -> None:
    graph = part_graph(PACKAGE)
    crossings = sorted(f"{part} imports {other}" for part, forbidden in LOWER_THAN.items()
                       for other in graph.get(part, set()) & forbidden)
    assert crossings == []


def test_the_job_entrypoint_does_not_import_the_supervisor() -> None:
    job = PACKAGE.parents[1] / "jobs" / "run_plan.py"
    known = modules(PACKAGE)
    parts = {part_of(name) for name in imported(job, known)}
    assert parts and "tandem.supervisor" not in parts and "tandem.airflow" not in parts
