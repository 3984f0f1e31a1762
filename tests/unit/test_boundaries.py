"""The architecture's import rules, checked on the source (a live import is checked in
tests/integration/test_light_imports.py).

The layers, from the bottom: `core.types` and `core.faults`; the scheduling core
(`core.sched`) and the job rules (`core.jobs`); the simulator (`core.sim`), the
runners (`core.runners`) and the store protocols (`core.ports`) over those; the OpenAI
protocol (`core.openai`) over the job rules and the stores' records; the daemon
(`core.daemon`) over all but the protocol; `storage` implements the protocols with
domain records only; `api` serves HTTP over them; `cli` composes everything. No package
imports one that imports it back.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

from tests.support.source import parsed

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"api": "fsched.api", "cli": "fsched.cli", "core": "fsched.core", "storage": "fsched.storage"}
# The Hugging Face runner (loading, KV batch, sampling, runner) is the only
# place allowed to import torch and transformers.
RUNNER_PACKAGE = "core/runners/hf/"
# What each core package may import from fsched, beyond itself.
CORE_LAYERS = {
    "sched": ("fsched.core.types",),
    "sim": ("fsched.core.types", "fsched.core.sched"),
    # fsched's own rules: they know nothing of the OpenAI protocol that reads and writes them.
    "jobs": ("fsched.core.types",),
    # The protocol in OpenAI's words over the domain: its records (progress, results) and rules.
    "openai": ("fsched.core.types", "fsched.core.jobs", "fsched.core.ports.records", "fsched.core.grammar"),
    # A claim returns each request's one live record (core/sched/request.py); the heartbeat carries
    # the scheduler's explanation of each request (its standing), nothing more of the scheduler; the
    # in-memory serving reads give latency percentiles by the one definition of a percentile.
    "ports": ("fsched.core.types", "fsched.core.jobs", "fsched.core.sched.request",
              "fsched.core.sched.explain", "fsched.core.sim.metrics"),
    # Grammars: a source, its limits and its isolated compile, over the domain's types only.
    "grammar": ("fsched.core.types",),
    # Structured output: the grammar a request's response_format compiles to is checked at submit
    # (core.openai, through core.grammar) and enforced by the runners, one definition for both.
    # Stamps (core/stamps.py) are a benchmark's instrument, off unless asked, like the crash points.
    "runners": ("fsched.core.types", "fsched.core.sched", "fsched.core.grammar", "fsched.core.stamps"),
    "daemon": ("fsched.core.types", "fsched.core.faults", "fsched.core.sched", "fsched.core.ports",
               "fsched.core.runners", "fsched.core.stamps"),
    # The replayer reads traces and reports as the simulator does, and names classes as the online API
    # maps them (service tiers): one definition of each.
    "replay": ("fsched.core.types", "fsched.core.sched", "fsched.core.sim", "fsched.core.openai.online"),
}
# The job table implements the store protocols with the domain's records: a claim returns each request's
# live record; nothing of the scheduler's state, a daemon, a runner or the OpenAI protocol.
STORAGE_MAY_IMPORT = ("fsched.storage", "fsched.core.types", "fsched.core.faults", "fsched.core.jobs",
                      "fsched.core.ports", "fsched.core.sched.request", "fsched.core.sim.metrics")
# The HTTP server speaks the core's records and rules; it neither runs a daemon nor a model.
API_MAY_IMPORT = ("fsched.api", "fsched.core.types", "fsched.core.jobs", "fsched.core.openai",
                  "fsched.core.ports", "fsched.core.sched", "fsched.core.stamps")
# The daemon's side of serving goes through the engine's own methods and the
# queue protocol: never into the scheduler, never to a concrete store.
DAEMON_MODULES = ("loop", "holdings", "leases", "stepfaults", "writer")


def imports_of(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def sources(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def test_core_imports_neither_storage_nor_cli():
    for path in sources("core"):
        bad = {n for n in imports_of(path) if n.startswith(("fsched.storage", "fsched.cli", "fsched.api"))}
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_scheduling_core_imports_nothing_from_serving_or_storage():
    for package, allowed in CORE_LAYERS.items():
        for path in sources(f"core/{package}"):
            own = f"fsched.core.{package}"
            bad = {
                n
                for n in imports_of(path)
                if n.startswith("fsched") and not n.startswith((own, *allowed))
            }
            assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_the_protocol_is_a_package_apart_from_the_rules_and_the_table():
    """core/jobs, the store protocols and storage never import the OpenAI protocol: the table keeps and
    returns domain records, and what they read as in OpenAI's JSON is the protocol's alone."""
    for folder in ("core/jobs", "core/ports", "core/daemon", "core/runners", "core/sched", "storage"):
        for path in sources(folder):
            bad = {n for n in imports_of(path) if n.startswith("fsched.core.openai")}
            assert not bad, f"{path.relative_to(ROOT)} imports {bad}"
    assert {"body", "fields", "messages", "answers", "responses", "batch"} <= {
        p.stem for p in sources("core/openai")}


def test_the_daemon_reaches_the_scheduler_only_through_the_engine():
    for name in DAEMON_MODULES:
        path = ROOT / "core" / "daemon" / f"{name}.py"
        # The share figures and the decayed use they are read from are pure arithmetic every layer
        # reports with, and a request's one live record (core/sched/request.py) is the daemon's as much
        # as the scheduler's; the scheduler's state is not.
        bad = {
            n
            for n in imports_of(path)
            if n.startswith(("fsched.core.sched", "fsched.core.ports.memory", "fsched.core.runners"))
            and n not in ("fsched.core.sched.shares", "fsched.core.sched.usage", "fsched.core.sched.request")
        }
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_storage_returns_domain_records_only():
    for path in sources("storage"):
        bad = {n for n in imports_of(path) if n.startswith("fsched") and not n.startswith(STORAGE_MAY_IMPORT)}
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_the_claim_returns_the_live_record_itself():
    """One record from claim to completion: the queue protocol's claim, the SQL claim and the in-memory
    one all return `Request` (core/sched/request.py), no shape of their own."""
    for path in ("core/ports/queue.py", "core/ports/memory/queue.py", "storage/sql_queue.py",
                 "storage/claim.py"):
        returns = {ast.unparse(node.returns) for node in ast.walk(parsed(ROOT / path))
                   if isinstance(node, ast.FunctionDef) and node.name in ("claim", "claimed")}
        assert returns == {"list[Request]"}, f"{path}: claim returns {returns}"


def test_http_handlers_reach_the_table_only_through_the_stores_they_are_given():
    """Neither storage nor cli, nor a daemon, runner or simulator: the core's records and rules."""
    for path in sources("api"):
        bad = {n for n in imports_of(path) if n.startswith("fsched") and not n.startswith(API_MAY_IMPORT)}
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_commands_and_handlers_use_the_store_protocols_never_the_sql_underneath():
    """cli/ and api/ open stores through storage/stores.py and use them by their protocols: no SQL store
    class by name, no `.db` (the Database) or `.dialect` of one."""
    for folder in ("cli", "api"):
        for path in sources(folder):
            tree = parsed(path)
            bad = {node.attr for node in ast.walk(tree)
                   if isinstance(node, ast.Attribute) and node.attr in ("db", "dialect")}
            bad |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    for alias in node.names if alias.name.startswith("Sql")}
            bad |= {node.id for node in ast.walk(tree)
                    if isinstance(node, ast.Name) and node.id.startswith("Sql")}
            assert not bad, f"{path.relative_to(ROOT)} uses {bad}"


def package_of(module: str) -> str:
    """The package a module belongs to, for the import graph: `fsched.cli`, `fsched.core.sched`, ..."""
    parts = module.split(".")
    return ".".join(parts[:3] if parts[1] == "core" and len(parts) > 2 else parts[:2])


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return "fsched." + ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_graph() -> dict[str, set[str]]:
    """Package -> the other fsched packages its modules import."""
    graph: dict[str, set[str]] = {}
    for folder in PACKAGES:
        for path in sources(folder):
            own = package_of(module_name(path))
            edges = graph.setdefault(own, set())
            edges.update(package_of(n) for n in imports_of(path) if n.startswith("fsched."))
            edges.discard(own)
    return graph


def find_cycle(graph: Mapping[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a path that ends where it starts, or None."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" after

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]  # an open node is on the current path
            if nxt not in state and (found := visit(nxt, [*path, nxt])):
                return found
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_no_two_packages_import_each_other_even_through_others():
    graph = package_graph()
    assert {"fsched.core.daemon", "fsched.core.runners", "fsched.core.ports", "fsched.api"} <= set(graph)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle between packages: " + " -> ".join(cycle)


def test_the_cycle_check_finds_a_cycle_through_three_packages():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_every_core_package_is_installed():
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    for init in (ROOT / "core").rglob("__init__.py"):
        dotted = "fsched." + ".".join(init.parent.relative_to(ROOT).parts)
        assert dotted in listed, f"{dotted} is missing from pyproject.toml's packages"


def test_sql_lives_only_in_storage():
    for folder in ("core", "cli", "api"):
        for path in sources(folder):
            bad = {n for n in imports_of(path) if n.split(".")[0] in ("sqlalchemy", "sqlite3", "psycopg")}
            assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_torch_only_in_the_runner():
    for folder in ("core", "cli", "storage", "api"):
        for path in sources(folder):
            rel = str(path.relative_to(ROOT))
            if rel.startswith(RUNNER_PACKAGE):
                continue
            bad = {n for n in imports_of(path) if n.split(".")[0] in ("torch", "transformers", "tokenizers")}
            assert not bad, f"{rel} imports {bad}"


def test_no_module_imports_its_package_by_folder_name():
    for folder in PACKAGES:
        for path in sources(folder):
            bad = {n for n in imports_of(path) if n.split(".")[0] in PACKAGES}
            assert not bad, f"{path.relative_to(ROOT)} imports {bad}; use fsched.{folder}"
