"""What a fresh interpreter loads: the CLI, the scheduler, the engine loop and the simulator start without
torch (and the simulator without a database driver); a light command's help loads none of the other
commands' machinery. A subprocess, so that nothing this test run has
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


# What a command that only reads or writes the job table never needs.
HEAVY = ["torch", "transformers", "llguidance", "uvicorn", "fastapi", "httpx", "sqlalchemy",
         "fsched.core.daemon.loop", "fsched.core.sched.scheduler", "fsched.core.sim.simulator", "fsched.api"]


def loaded_by_the_command(args: list[str]) -> list[str]:
    """The modules of `heavy` (and the fsched.cli modules) that `fsched ARGS` loaded, in a fresh
    interpreter; the command must succeed."""
    code = (
        f"import sys\nfrom fsched.cli.main import app\ntry:\n    app({args!r}, prog_name='fsched')\n"
        "except SystemExit as e:\n    assert not e.code, e.code\n"
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in "
        f"{sorted({m.split('.')[0] for m in HEAVY})!r} or m.startswith('fsched.cli.'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1].split(",")


def heavy_in(loaded: list[str]) -> list[str]:
    return [m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY)]


def test_status_help_loads_neither_torch_nor_another_commands_machinery():
    loaded = loaded_by_the_command(["status", "--help"])
    assert heavy_in(loaded) == []
    assert "fsched.cli.status" in loaded and "fsched.cli.daemon" not in loaded


def test_the_top_level_help_imports_no_subcommand():
    loaded = loaded_by_the_command(["--help"])
    assert heavy_in(loaded) == []
    assert [m for m in loaded if m.startswith("fsched.cli.")] == ["fsched.cli.main"]
