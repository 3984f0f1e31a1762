"""The architecture's import rules, checked on the source and on a live import.

The layers, from the bottom: `core.types` and `core.faults`; the scheduling core
(`core.sched`); the simulator (`core.sim`) and the job rules (`core.jobs`) over it;
the runners (`core.runners`) and the daemon (`core.daemon`) over those; `storage` implements the store
protocols; `cli` composes everything.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"api": "fsched.api", "cli": "fsched.cli", "core": "fsched.core", "storage": "fsched.storage"}
# The Hugging Face runner (loading, KV batch, sampling, runner) is the only
# place allowed to import torch and transformers.
RUNNER_PACKAGE = "core/runners/hf/"
# What each core package may import from fsched, beyond itself.
CORE_LAYERS = {
    "sched": ("fsched.core.types",),
    "sim": ("fsched.core.types", "fsched.core.sched"),
    "jobs": ("fsched.core.types", "fsched.core.ports", "fsched.core.faults"),
    "ports": ("fsched.core.types", "fsched.core.jobs"),
}
# The daemon's side of serving goes through the engine's own methods and the
# queue protocol: never into the scheduler, never to a concrete store.
DAEMON_MODULES = ("loop", "holdings", "leases", "stepfaults", "writer")


def imports_of(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
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


def test_http_handlers_reach_the_table_only_through_the_stores_they_are_given():
    for path in sources("api"):
        bad = {n for n in imports_of(path) if n.startswith(("fsched.storage", "fsched.cli"))}
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


def test_the_daemon_reaches_the_scheduler_only_through_the_engine():
    for name in DAEMON_MODULES:
        path = ROOT / "core" / "daemon" / f"{name}.py"
        # The share figures are pure functions every layer reports with; the scheduler's state is not.
        bad = {
            n
            for n in imports_of(path)
            if n.startswith(("fsched.core.sched", "fsched.core.ports.memory"))
            and n != "fsched.core.sched.shares"
        }
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


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


def test_cli_scheduler_and_engine_loop_start_without_torch():
    code = (
        "import sys, fsched.cli.main, fsched.core.daemon.loop, fsched.core.sim.simulator\n"
        "import fsched.core.runners.standin\n"
        "heavy = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
