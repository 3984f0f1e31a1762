"""docs/architecture.md against the tree: its folder map names every folder that exists and none that is
gone, and every path the page names exists (test_docs checks that it names every module)."""

from __future__ import annotations

import re
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
NAMED_PATH = re.compile(r"`((?:api|cli|core|storage|tests|bench|scripts|docs|sample_jobs)/[\w./-]*)`")
SKIP = {"__pycache__", "__init__.py"}


def folder_map(page: str) -> dict[str, str]:
    """The map's entries as repository paths (folders end in /), each with its description."""
    block = page.split("## Folder map", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    entries: dict[str, str] = {}
    parents: list[tuple[int, str]] = []  # (indent, path) of the folders enclosing the next line
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        name, _, description = line.strip().partition(" ")
        while parents and parents[-1][0] >= indent:
            parents.pop()
        path = (parents[-1][1] if parents else "") + name
        entries[path] = description.strip()
        if name.endswith("/"):
            parents.append((indent, path))
    return entries


def tracked_folders(root: Path) -> set[str]:
    """The repository's top-level folders: the visible ones that .gitignore does not exclude."""
    ignored = [line.strip().strip("/") for line in (root / ".gitignore").read_text().splitlines()
               if line.strip().endswith("/") and "/" not in line.strip().strip("/")]
    return {f"{p.name}/" for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")
            and not any(fnmatch(p.name, pattern) for pattern in ignored)}


def children(folder: Path) -> set[str]:
    return {f"{p.name}/" if p.is_dir() else p.name for p in folder.iterdir()
            if p.name not in SKIP and (p.is_dir() or p.suffix == ".py")}


def map_problems(page: str, root: Path, top_folders: set[str]) -> list[str]:
    entries = folder_map(page)
    problems = [f"the map names {path}, which is gone" for path in entries if not (root / path).exists()]
    problems += [f"the map does not name {folder}" for folder in sorted(top_folders - set(entries))]
    inside_core = {path.removeprefix("core/") for path in entries if path.startswith("core/")}
    inside_core = {name for name in inside_core if "/" not in name.rstrip("/")}  # direct children only
    unnamed = sorted(children(root / "core") - inside_core)
    problems += [f"the map does not name core/{name}" for name in unnamed]
    named_tests = set(re.findall(r"(\w+)/", entries.get("tests/", "")))
    actual_tests = {p.name for p in (root / "tests").iterdir() if p.is_dir() and any(p.glob("*.py"))}
    problems += [f"tests/ does not list {name}/" for name in sorted(actual_tests - named_tests)]
    problems += [f"tests/ lists {name}/, which is gone" for name in sorted(named_tests - actual_tests)]
    return problems


def test_the_folder_map_matches_the_tree():
    page = DOC.read_text()
    assert map_problems(page, ROOT, tracked_folders(ROOT)) == []
    named = set(folder_map(page))
    assert {"api/", "cli/", "core/", "storage/", "tests/", "core/daemon/", "core/runners/"} <= named


def test_every_path_the_page_names_exists():
    gone = [path for path in NAMED_PATH.findall(DOC.read_text()) if not (ROOT / path).exists()]
    assert gone == [], f"docs/architecture.md names what is gone: {gone}"


def test_the_map_check_catches_a_stale_and_a_missing_entry(tmp_path):
    for path in ("core/ports", "core/sched", "tests/unit", "tests/e2e", "api"):
        (tmp_path / path).mkdir(parents=True)
        (tmp_path / path / "x.py").write_text("")
    (tmp_path / "core" / "types.py").write_text("")
    page = ("## Folder map\n\n```text\napi/  the server\ncore/\n  types.py  words\n  ports/  protocols\n"
            "  serve/  the daemon\ntests/  unit/, integration/\n```\n")
    assert map_problems(page, tmp_path, {"api/", "core/", "tests/", "bench/"}) == [
        "the map names core/serve/, which is gone",
        "the map does not name bench/",
        "the map does not name core/sched/",
        "tests/ does not list e2e/",
        "tests/ lists integration/, which is gone",
    ]
