"""What a fresh interpreter loads: the CLI, the scheduler, the engine loop and the simulator start without
torch (and the simulator without a database driver). A subprocess, so that nothing this test run has
already imported hides an import. (The import rules on the source: tests/unit/test_boundaries.py.)"""

from __future__ import annotations

import subprocess
import sys


def loaded_in_a_fresh_interpreter(modules: list[str], heavy: list[str]) -> list[str]:
    code = (
        f"import sys\nfor m in {modules!r}: __import__(m)\n"
        f"print(','.join(m for m in {heavy!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return [m for m in out.stdout.strip().split(",") if m]


def test_cli_scheduler_and_engine_loop_start_without_torch():
    modules = ["fsched.cli.main", "fsched.core.daemon.loop", "fsched.core.sim.simulator",
               "fsched.core.runners.standin"]
    assert loaded_in_a_fresh_interpreter(modules, ["torch", "transformers"]) == []


def test_simulate_imports_neither_torch_nor_sqlalchemy():
    modules = ["fsched.cli.simulate", "fsched.core.sim.simulator"]
    assert loaded_in_a_fresh_interpreter(modules, ["torch", "transformers", "sqlalchemy"]) == []
