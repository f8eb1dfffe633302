"""The house: four services side by side on a shared agent core (STYLE.md §1).

- a service package (env, rollout, data, train) imports only the agent core and the kernel,
  never another service;
- the agent core imports only the kernel;
- no two files of the dart/ tree import each other, directly or around a circle;
- pure modules never touch the bus.

Imports are read from the source with ``ast`` (every ``import``, also inside functions and
``TYPE_CHECKING`` blocks: a deferred import is still a dependency), so a failure lists the
offending lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DART = REPO / "dart"
SERVICES = ("env", "rollout", "data", "train")
KERNEL = ("events", "bus", "log", "blobs", "config", "errors")
"""Packages and modules of dart/ every service may import, besides the agent core."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(DART.rglob("*.py"))}


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute or relative import in ``path``; ``from m import n`` counts
    as an import of ``m.n`` when that is a module of dart/, else of ``m``."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([node.module] if node.module else [])])
            for a in node.names:
                full = f"{base}.{a.name}"
                out.append((node.lineno, full if full in MODULES else base))
    return out


def top_package(module: str) -> str | None:
    """``env`` for ``dart.env.worker``, ``blobs`` for ``dart.blobs``; None outside dart."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "dart" else None


def violations(own: str, allowed: tuple[str, ...]) -> list[str]:
    """Lines of dart/<own>/ that import a dart package outside ``own`` and ``allowed``."""
    bad = []
    for path in sorted((DART / own).rglob("*.py")):
        for line, name in imports_of(path):
            other = top_package(name)
            if other is not None and other != own and other not in allowed:
                bad.append(f"dart/{path.relative_to(DART)}:{line}: imports {name}")
    return bad


@pytest.mark.parametrize("service", SERVICES)
def test_a_service_imports_only_the_agent_core_and_the_kernel(service: str) -> None:
    bad = violations(service, ("agent", *KERNEL))
    assert not bad, ("services meet only through events; move what they share to dart/agent or the kernel:\n"
                     + "\n".join(bad))


def test_the_agent_core_imports_only_the_kernel() -> None:
    bad = violations("agent", KERNEL)
    assert not bad, "the agent core sits below the services:\n" + "\n".join(bad)


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_import_cycles_are_found() -> None:
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_between_files_of_dart() -> None:
    graph = {m: {n for _, n in imports_of(p) if n in MODULES and n != m} for m, p in MODULES.items()}
    assert import_cycles(graph) == []


@pytest.mark.parametrize("path", [DART / "events" / "codec.py", DART / "events" / "types.py",
                                  DART / "events" / "manifest.py", DART / "blobs.py", DART / "config.py",
                                  *sorted((DART / "agent").rglob("*.py"))],
                         ids=lambda p: str(p.relative_to(DART)))
def test_the_kernel_and_the_agent_core_do_not_touch_the_bus(path: Path) -> None:
    assert not any(n.startswith(("dart.bus", "aiokafka", "confluent_kafka")) for _, n in imports_of(path))


GUEST_AGENT_MODULES = {
    "dart", "dart.errors", "dart.events", "dart.events.types", "dart.agent", "dart.agent.actions", "dart.env",
    "dart.env.xdotool", "dart.env.guest_agent", "dart.env.guest_agent.protocol", "dart.env.guest_agent.server",
    "dart.env.guest_agent.desktop",
}
"""What the guest agent runs: its server, the typed actions and their wire form, and xdotool (12
modules; 25 before the xdotool wrapper left dart/env/xdesktop, fastavro and the codec among them)."""


def test_the_guest_agent_imports_only_what_it_runs() -> None:
    import subprocess
    import sys

    code = ("import sys, dart.env.guest_agent.server; "
            "print(' '.join(sorted(m for m in sys.modules if m == 'dart' or m.startswith('dart.')))); "
            "print('fastavro' in sys.modules, 'aiokafka' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}).stdout.splitlines()
    loaded = set(out[0].split())
    assert loaded == GUEST_AGENT_MODULES, (f"more: {sorted(loaded - GUEST_AGENT_MODULES)}, "
                                           f"fewer: {sorted(GUEST_AGENT_MODULES - loaded)}")
    assert len(loaded) == 12
    assert out[1] == "False False False"  # no codec, bus client or model in a VM
