"""`pip install .` gives one `fsched` package and a working command, nothing top-level."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from .conftest import REPO


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel `pip install .` builds and installs, built once for both tests."""
    folder = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(folder), str(REPO)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = folder.glob("fsched-*.whl")
    return built


def test_wheel_holds_only_the_fsched_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"fsched", next(t for t in tops if t.endswith(".dist-info"))}, tops
    for module in ("fsched/cli/main.py", "fsched/core/types.py", "fsched/storage/jobstore.py"):
        assert module in names
    # The dashboard's page and the vendored chart library are package data: no build step, no CDN.
    for asset in ("fsched/api/static/dashboard.html", "fsched/api/static/dashboard.js",
                  "fsched/core/data/web/uPlot.iife.min.js", "fsched/core/data/web/uPlot.LICENSE"):
        assert asset in names, asset


def test_fresh_venv_install_runs_from_another_folder(tmp_path, wheel):
    venv = tmp_path / "venv"
    # No pip of its own (ensurepip costs seconds): this environment's pip installs into it.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]
    # --no-deps: nothing is downloaded; see the .pth file below.
    subprocess.run(
        [*pip, "install", "-q", "--no-deps", str(wheel)], check=True, capture_output=True, timeout=300
    )
    # The dependencies (torch among them) come from this test's own environment,
    # appended after the new venv's site-packages by a .pth file, so the new
    # venv's fsched is the one found first.
    new_site = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(new_site) / "zz_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = subprocess.run(
        [str(venv / "bin" / "fsched"), "--help"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "submit" in out.stdout and "tenants" in out.stdout
    # `fsched --help` imports no subcommand (each is imported when it runs): every one loads here.
    probe = (
        "import importlib.util as u, fsched.cli.main as m\n"
        "for name, _, _ in m.COMMANDS: m.load_command(name)\n"
        "print(m.__file__)\n"
        "print([n for n in ('core', 'cli', 'storage') if u.find_spec(n)])"
    )
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    location, top_level = out.stdout.splitlines()
    assert location.startswith(str(venv)), location
    assert top_level == "[]"
