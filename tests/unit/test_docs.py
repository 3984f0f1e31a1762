"""The docs stay true: every `fsched ...` line they show parses, links resolve, nothing cites the outside.

The command lines are checked against the live typer app (its click tree), so a
command or flag that is renamed or removed fails here, and one that is added
needs nothing but its docs. What is checked of a command line: the command and
each subcommand exist, and every `--flag` or `-f` belongs to the command it is
given to. Placeholders (`<job>`, `FILE`, `$VAR`) are values and are not checked.
Costs a few seconds at most (imports the CLI once, reads the docs and the sources).
"""

from __future__ import annotations

import functools
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer.main

from fsched.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 300

FENCE = re.compile(r"^(\s*)(```+|~~~+)")
INLINE = re.compile(r"(`+)(.+?)\1", re.DOTALL)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# Shell separators stand between spaces (`a | b`, `x && y`, `cmd &`); a bar inside a word
# (`--class realtime|batch`) lists a synopsis's alternatives, and `2>&1` is a redirection.
SEPARATORS = re.compile(r"\s(?:\|\||&&|\||&)(?=\s|$)|;")
# Words that run the command after them: `sudo -u alice fsched ...`, `timeout 60 fsched ...`.
WRAPPERS = {"sudo", "exec", "time", "nohup", "env", "timeout", "watch", "command", "!"}
REDIRECT = re.compile(r"^(\d*>>?|<|\d*>&\d*|&>)")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=(.*)$")
# What a doc must not say: the project's private design file and its section
# numbers, issue numbers, the tracker's command, and files beside the repository.
CITATIONS = {
    "the design file": re.compile(r"\bDESIGN\b"),
    "a section sign": re.compile("§"),
    "an issue number": re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE),
    "the issue tracker's command": re.compile(r"`issues(\s+show)?[^`]*`"),
    "a work session": re.compile(
        r"\bwork sessions?\b|\b(previous|earlier|next|later) sessions?\b", re.IGNORECASE
    ),
    "a file beside the repository": re.compile(r"(?<![\w.])\.\./shared\b|\bshared/DESIGN"),
}
# Repository paths a doc names in code spans must exist.
REPO_PATH = re.compile(r"^(?:cli|core|storage|tests|bench|scripts|docs|sample_jobs)/[\w./-]*$")


@dataclass(frozen=True)
class Snippet:
    doc: str
    line: int
    text: str
    inline: bool


def snippets(markdown: str, doc: str = "<snippet>") -> list[Snippet]:
    """Every piece of code in a Markdown text: fenced and indented blocks (one per line, with
    `\\` continuations joined) and inline code spans (newlines inside a span become spaces)."""
    found: list[Snippet] = []
    prose: list[str] = []
    lines = markdown.splitlines()
    fence: str | None = None
    pending = ""
    pending_at = 0
    previous_blank = True
    in_indented = False
    for number, raw in enumerate(lines, start=1):
        opened = FENCE.match(raw)
        if fence is None and opened:
            fence, pending = opened.group(2)[0] * 3, ""
            prose.append("")
            continue
        if fence is not None:
            if raw.strip().startswith(fence):
                fence = None
                if pending:
                    found.append(Snippet(doc, pending_at, pending, False))
                pending = ""
            else:
                pending_at = pending_at if pending else number
                pending = _continue(pending, raw, found, doc, pending_at)
                if not pending:
                    pending_at = 0
            prose.append("")
            continue
        indented = raw.startswith(("    ", "\t")) and raw.strip() != ""
        if indented and (previous_blank or in_indented):
            in_indented = True
            pending_at = pending_at if pending else number
            pending = _continue(pending, raw.strip(), found, doc, pending_at)
            prose.append("")
            continue
        if pending:
            found.append(Snippet(doc, pending_at, pending, False))
            pending = ""
        in_indented = in_indented and raw.strip() == ""
        previous_blank = raw.strip() == ""
        prose.append(raw)
    if pending:
        found.append(Snippet(doc, pending_at, pending, False))
    text = "\n".join(prose)
    for match in INLINE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        # In a table a pipe inside code is written `\|`; it separates alternatives, not commands.
        body = match.group(2).replace("\\|", "/").replace("\n", " ")
        found.append(Snippet(doc, line, body, True))
    return found


def _continue(pending: str, raw: str, found: list[Snippet], doc: str, at: int) -> str:
    """Join a code line onto a pending one; return what is still open (a trailing `\\`)."""
    joined = f"{pending} {raw.strip()}" if pending else raw.strip()
    if joined.endswith("\\"):
        return joined[:-1].rstrip()
    found.append(Snippet(doc, at, joined, False))
    return ""


def _is_program(token: str) -> bool:
    if token == "fsched" or token.endswith("/fsched"):
        return True
    assigned = ASSIGNMENT.match(token)  # e.g. systemd's ExecStart=/opt/x/.venv/bin/fsched, not a URL
    return bool(assigned and assigned.group(1).endswith("/fsched") and "://" not in assigned.group(1))


def _words(segment: str) -> list[str]:
    try:
        return shlex.split(segment, comments=True)
    except ValueError:  # an unbalanced quote in an excerpt: words are enough here
        return segment.split()


def command_lines(snippet: Snippet) -> list[list[str]]:
    """The fsched invocations in one snippet: the words after the program, per shell command.

    The program must stand where a shell runs a command: first, after variable assignments, or
    after a wrapper such as `sudo -u alice` (so `chgrp fsched DIR` names a group, not a command)."""
    out = []
    for segment in SEPARATORS.split(snippet.text):
        words = _words(segment)
        i = 0
        while i < len(words) and ASSIGNMENT.match(words[i]) and not _is_program(words[i]):
            i += 1
        if i < len(words) and words[i] in WRAPPERS:
            after = [j for j in range(i + 1, min(i + 5, len(words))) if _is_program(words[j])]
            i = after[0] if after else len(words)
        if i < len(words) and _is_program(words[i]):
            out.append(words[i + 1 :])
    return out


@functools.cache
def _root():
    """The live command tree (built once: typer rebuilds it on every call), every subcommand loaded
    (`fsched` imports a subcommand on first use)."""
    root = typer.main.get_command(app)
    for name in root.list_commands(None):
        root.get_command(None, name)
    return root


def _placeholder(word: str) -> bool:
    word = word.strip("[]().,")
    return word.startswith(("<", "$", "{")) or word.isupper() or word in ("...", "…")


def _options(command) -> dict[str, bool]:
    """Each option name of a click command -> whether it is a flag (takes no value)."""
    names: dict[str, bool] = {}
    for param in command.params:
        if param.param_type_name != "option":
            continue
        for name in (*param.opts, *param.secondary_opts):
            names[name] = bool(getattr(param, "is_flag", False) or getattr(param, "count", False))
    names["--help"] = True
    return names


def check_command(words: list[str], root=None) -> list[str]:
    """What is wrong with one invocation (`fsched` already dropped): unknown commands and flags."""
    command = root if root is not None else _root()
    path = ["fsched"]
    words = [w for w in words if w]
    i = 0
    while hasattr(command, "commands"):  # a group: options of its own, then a subcommand
        if i >= len(words):
            return []
        word = words[i].strip("[]()")
        if word.startswith("-"):
            if word.split("=")[0] not in _options(command):
                return [f"{' '.join(path)}: no option {word.split('=')[0]}"]
            i += 1
            continue
        if _placeholder(word) or REDIRECT.match(word):
            return []
        if word not in command.commands:
            return [f"{' '.join(path)}: no command {word!r}"]
        command = command.commands[word]
        path.append(word)
        i += 1
    return _check_options(command, words[i:], " ".join(path))


def _alternatives(words: list[str]) -> list[str]:
    """`[--access-log|--no-access-log]` in a synopsis: each alternative is a flag to check."""
    out = []
    for word in words:
        parts = word.strip("[]").split("|")
        out.extend(parts if len(parts) > 1 and all(p.startswith("-") for p in parts) else [word])
    return out


def _check_options(command, words: list[str], name: str) -> list[str]:
    options = _options(command)
    problems = []
    skip_value = False
    for raw in _alternatives(words):
        if REDIRECT.match(raw) or raw == "--":
            break
        word = raw.strip("[](),")
        if word.endswith("..."):
            word = word[:-3]
        if skip_value and not word.startswith("--"):
            skip_value = False
            continue
        skip_value = False
        if word.startswith("--") and len(word) > 2:
            flag = word.split("=")[0]
            if flag not in options:
                problems.append(f"{name}: no option {flag}")
            else:
                skip_value = not options[flag] and "=" not in word
        elif re.fullmatch(r"-[A-Za-z]+", word):
            letters = [f"-{c}" for c in word[1:]]
            unknown = [f for f in letters if f not in options]
            if unknown:
                problems.append(f"{name}: no option {unknown[0]}")
            else:
                skip_value = not options[letters[-1]]
    return problems


def problems_in(markdown: str, doc: str = "<snippet>") -> list[str]:
    problems = []
    for snippet in snippets(markdown, doc):
        for words in command_lines(snippet):
            for problem in check_command(words):
                problems.append(f"{snippet.doc}:{snippet.line}: `{snippet.text}`: {problem}")
    return problems


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# -- the docs as they are -------------------------------------------------------------------


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_every_fsched_command_line_shown_parses(doc: Path):
    assert problems_in(doc.read_text(), _rel(doc)) == []


def test_the_docs_show_command_lines_at_all():
    """Guards the test above against passing on nothing (a broken extractor finds no lines)."""
    shown = [w for d in DOCS for s in snippets(d.read_text(), _rel(d)) for w in command_lines(s)]
    assert len(shown) >= 40, f"only {len(shown)} fsched command lines found in the docs"
    readme = [w for s in snippets(README.read_text()) for w in command_lines(s)]
    assert {w[0] for w in readme if w} >= {"submit", "daemon"}, "README must show submit and daemon"


def test_every_command_and_option_is_documented():
    """Each command and each of its options appears in some fsched line of README or docs/."""
    shown: set[tuple[str, str]] = set()
    for doc in DOCS:
        for snippet in snippets(doc.read_text(), _rel(doc)):
            for words in command_lines(snippet):
                shown.update(_shown_options(words))
    missing = []
    for path, command in _leaves(_root(), "fsched"):
        if (path, "") not in shown:
            missing.append(path)
        for param in command.params:
            if param.param_type_name == "option" and (path, param.opts[0]) not in shown:
                if not any((path, o) in shown for o in param.opts):
                    missing.append(f"{path} {param.opts[0]}")
    assert missing == [], f"not shown in any `fsched ...` line of README.md or docs/: {missing}"


def _leaves(command, path: str):
    if hasattr(command, "commands"):
        for name, sub in command.commands.items():
            yield from _leaves(sub, f"{path} {name}")
    else:
        yield path, command


def _shown_options(words: list[str]) -> set[tuple[str, str]]:
    command = _root()
    path = "fsched"
    rest = list(words)
    while hasattr(command, "commands") and rest and rest[0] in command.commands:
        command = command.commands[rest[0]]
        path = f"{path} {rest.pop(0)}"
    if hasattr(command, "commands"):
        return set()
    flags = {w.strip("[](),").split("=")[0] for w in _alternatives(rest) if w.strip("[(").startswith("-")}
    return {(path, "")} | {(path, flag) for flag in flags}


def test_readme_is_a_front_door():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"
    assert "bash scripts/test.sh" in README.read_text(), "README must say how to run the tests"


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_no_doc_cites_what_a_reader_cannot_open(doc: Path):
    found = []
    for number, line in enumerate(doc.read_text().splitlines(), start=1):
        for what, pattern in CITATIONS.items():
            if pattern.search(line) and "https://" not in line:  # a URL a reader can open
                found.append(f"{_rel(doc)}:{number}: {what}: {line.strip()}")
    assert found == []


def test_no_source_cites_what_a_reader_cannot_open():
    """The same rule for code, docstrings and comments, outside this file (which names the patterns)."""
    found = []
    for folder in ("cli", "core", "storage", "tests", "bench", "scripts"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in (".py", ".sh", ".md") or path == Path(__file__).resolve():
                continue
            for number, line in enumerate(path.read_text().splitlines(), start=1):
                hits = [what for what, pattern in CITATIONS.items() if pattern.search(line)]
                if hits and "https://" not in line:
                    found.append(f"{_rel(path)}:{number}: {hits[0]}: {line.strip()}")
    assert found == [], "\n".join(found)


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_relative_links_resolve_inside_the_repository(doc: Path):
    broken = []
    text = doc.read_text()
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        path = (doc.parent / file_part).resolve() if file_part else doc
        if ROOT not in path.parents and path != ROOT:
            broken.append(f"{target}: outside the repository")
        elif not path.exists():
            broken.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path.read_text()):
            broken.append(f"{target}: no heading #{anchor} in {_rel(path)}")
    assert broken == [], f"{_rel(doc)}: {broken}"


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    anchors = set()
    for line in markdown.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title)))
    return anchors


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_repository_paths_named_in_code_exist(doc: Path):
    missing = []
    for snippet in snippets(doc.read_text(), _rel(doc)):
        for word in snippet.text.replace(",", " ").split():
            word = word.strip("`'\"()[]:;")
            path = word.split("::")[0]
            if REPO_PATH.match(path) and not any(c in path for c in "*<{$") and not (ROOT / path).exists():
                missing.append(f"{snippet.doc}:{snippet.line}: {path}")
    assert missing == []


def test_the_architecture_map_names_every_module():
    """docs/architecture.md lists each package and module of the installed packages by its path."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    names = []
    packages = sorted(p.parent.name for p in ROOT.glob("*/__init__.py") if p.parent.name != "tests")
    assert {"cli", "core", "storage"} <= set(packages)
    for folder in packages:
        for path in sorted((ROOT / folder).rglob("*.py")):
            names.append(f"{_rel(path.parent)}/" if path.name == "__init__.py" else _rel(path))
    absent = [name for name in names if f"`{name}`" not in text]
    assert absent == [], f"docs/architecture.md does not list: {absent}"


# -- the checker itself, on snippets made up to break it ----------------------------------


def test_a_made_up_flag_fails():
    doc = "Run it:\n\n```\nfsched submit jobs.jsonl --tenat alice\n```\n"
    assert problems_in(doc) == ["<snippet>:4: `fsched submit jobs.jsonl --tenat alice`: fsched submit: "
                                "no option --tenat"]


def test_a_made_up_command_or_short_flag_fails_inline_too():
    assert "no command 'sumbit'" in problems_in("Try `fsched sumbit x.jsonl`.")[0]
    assert "no command 'rename'" in problems_in("Try `fsched tenants rename a b`.")[0]
    assert "no option -z" in problems_in("Try `fsched status -z`.")[0]
    assert "no option --weight" in problems_in("`fsched tenants set-weight a 2 --weight 3`")[0]


def test_a_flag_of_another_command_fails():
    # --until-idle belongs to `daemon`, not `submit`.
    assert "no option --until-idle" in problems_in("    fsched submit a.jsonl --until-idle\n")[0]


def test_continuations_pipes_variables_and_placeholders():
    good = (
        "```bash\n"
        "FSCHED_DB=$HOME/q.db .venv/bin/fsched submit <file> \\\n"
        "    --class realtime --json | jq .job_id\n"
        "fsched results $JOB -o out.jsonl && fsched status --all  # then look\n"
        "sudo -u alice fsched cancel JOB_ID... > /dev/null 2>&1\n"
        "```\n"
        "Synopsis: `fsched submit FILE... [--tenant T] [--class realtime\\|streaming\\|batch]`,\n"
        "`fsched simulate TRACE [--policy P]... [--mix\nrealtime=0.1]`, `fsched <command> --help`.\n"
    )
    assert problems_in(good) == []
    shown = [w for s in snippets(good) for w in command_lines(s)]
    assert ["submit", "<file>", "--class", "realtime", "--json"] in shown
    assert ["results", "$JOB", "-o", "out.jsonl"] in shown and ["status", "--all"] in shown

    bad = "```\nfsched daemon --model standin \\\n  --max-batch 8 \\\n  --bogus 3\n```\n"
    assert problems_in(bad) == ["<snippet>:2: `fsched daemon --model standin --max-batch 8 --bogus 3`: "
                                "fsched daemon: no option --bogus"]
    assert problems_in("`fsched status [--json|--watch]`") == []
    assert "no option --wach" in problems_in("`fsched status [--json|--wach]`")[0]
    piped = "```\ncat x | fsched submit - --nope\n```\n"
    assert "no option --nope" in problems_in(piped)[0]


def test_a_value_that_looks_like_a_flag_is_a_value():
    assert problems_in("`fsched submit - --name -weird --json`") == []


def test_words_that_only_contain_fsched_are_not_commands():
    text = (
        "`fsched-tiny` `fsched.cli` `fsched: error: no job` and\n\n"
        "```\nDescription=fsched daemon on GPU\nchgrp -R fsched /srv/q\n"
        "export FSCHED_DB=postgresql+psycopg://u@h/fsched\n```\n"
    )
    assert [w for s in snippets(text) for w in command_lines(s)] == []


def test_citations_and_links_are_caught():
    assert CITATIONS["the design file"].search("see DESIGN §3")
    assert CITATIONS["an issue number"].search("(issue 4/6)")
    assert CITATIONS["a file beside the repository"].search("fsched simulate ../shared/traces/x.csv")
    assert CITATIONS["a work session"].search("as the previous session measured")
    for fine in ("every fsched session sets a timeout", "one tiny model for this session", "issued 3 claims"):
        assert not any(p.search(fine) for p in CITATIONS.values()), fine
    assert "limits" in _anchors("## Limits\n") and "access-and-trust" in _anchors("## Access and trust")
