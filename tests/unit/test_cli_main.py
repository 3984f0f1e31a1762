"""The top-level command list: each subcommand's summary, shown by `fsched --help` without importing the
subcommand, is the first paragraph of that subcommand's own help."""

from __future__ import annotations

import pytest

from fsched.cli.main import COMMANDS, app, load_command


def first_paragraph(text: str) -> str:
    return " ".join(text.strip().split("\n\n", 1)[0].split())


@pytest.mark.parametrize(("name", "summary"), [(name, summary) for name, _, summary in COMMANDS])
def test_each_summary_is_the_first_paragraph_of_the_commands_help(name, summary):
    command = load_command(name)
    assert command.name == name
    assert first_paragraph(command.help or "") == summary


def test_every_subcommand_is_listed_once_and_unknown_names_are_none():
    from typer.main import get_command

    group = get_command(app)
    names = [name for name, _, _ in COMMANDS]
    assert group.list_commands(None) == names and len(set(names)) == len(names)
    assert group.get_command(None, "nosuch") is None
    assert group.get_command(None, "status").params  # the real command, its options built
