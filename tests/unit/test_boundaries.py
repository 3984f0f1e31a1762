"""DESIGN §1's import boundaries, checked on the source and on a live import."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"cli": "fsched.cli", "core": "fsched.core", "storage": "fsched.storage"}
# The model runner (one package: loading, KV batch, sampling, runner) is the
# only place allowed to import torch and transformers.
RUNNER_PACKAGE = "core/runner/"


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
        bad = {n for n in imports_of(path) if n.startswith(("fsched.storage", "fsched.cli"))}
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_sql_lives_only_in_storage():
    for folder in ("core", "cli"):
        for path in sources(folder):
            bad = {n for n in imports_of(path) if n.split(".")[0] in ("sqlalchemy", "sqlite3", "psycopg")}
            assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_torch_only_in_the_runner():
    for folder in ("core", "cli", "storage"):
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
        "import sys, fsched.cli.main, fsched.core.engine, fsched.core.simulator\n"
        "heavy = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
