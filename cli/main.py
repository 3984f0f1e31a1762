"""The `fsched` command: composes the subcommands, holds no logic of its own.

A subcommand's module is imported only when that subcommand runs (or shows its own help): `fsched
status` does not load the daemon's scheduler and engine, nor `fsched --help` any subcommand. The
command list below carries each one's summary line for the top-level help; tests/unit/test_cli_main.py
checks it against the command's own help.
"""

from __future__ import annotations

import importlib

import typer
from typer.core import TyperCommand, TyperGroup

# (name, "module:attribute", summary): a command function, or a typer app of subcommands. In the order
# `fsched --help` lists them.
COMMANDS = (
    ("submit", "fsched.cli.submit:submit", "Submit JSONL files of generation requests, one job per file."),
    ("status", "fsched.cli.status:status",
     "Show jobs (progress, tokens, age), tenants (weight, entitled share) and daemons."),
    ("cancel", "fsched.cli.jobs:cancel",
     "Cancel jobs: waiting requests at once, running ones at the daemon's next step."),
    ("results", "fsched.cli.jobs:results",
     "Write a job's results as OpenAI batch output lines, in input order."),
    ("purge", "fsched.cli.jobs:purge",
     "Reclaim the rows of ended batches (an fsched admin only): their requests, outputs and logprobs."),
    ("daemon", "fsched.cli.daemon:daemon",
     "Run the scheduler and the model over the job table: continuous batching, fairly."),
    ("simulate", "fsched.cli.simulate:simulate",
     "Replay a request trace through the scheduler against the engine cost model."),
    ("replay", "fsched.cli.replay:replay",
     "Send a request trace to an endpoint at its own times (scaled) and report it as simulate does."),
    ("generate", "fsched.cli.generate:generate",
     "Generate from one prompt through the running daemon; Ctrl-C cancels it."),
    ("demo", "fsched.cli.demo:demo",
     "Watch two tenants (weights 3:1) and a realtime chat share the tiny model, then a summary."),
    ("serve", "fsched.cli.serve:serve",
     "Serve the OpenAI API (completions, chat, the Batch API) over the job table."),
    ("vllm-front", "fsched.cli.vllm_front:vllm_front_command",
     "Serve vLLM's engine core to fsched daemons (--engine front://HOST:PORT), with no HTTP in between."),
    ("tenants", "fsched.cli.tenants:app", "List and manage tenants and their weights."),
    ("keys", "fsched.cli.keys:app", "Create, list and revoke API keys of `fsched serve` (admins only)."),
    ("limits", "fsched.cli.limits:app",
     "Show and set the limits on what clients may submit (setting: admins only)."),
)
_TARGETS = {name: target for name, target, _ in COMMANDS}
_SUMMARIES = {name: summary for name, _, summary in COMMANDS}


def load_command(name: str):
    """The click command of subcommand `name`, its module imported now."""
    module, attribute = _TARGETS[name].split(":")
    target = getattr(importlib.import_module(module), attribute)
    if isinstance(target, typer.Typer):
        command = typer.main.get_group(target)
    else:  # a command function: typer makes one command of a Typer that has only it
        single = typer.Typer(add_completion=False)
        # A command that passes what follows its options on (vllm-front to vLLM) says so on itself.
        single.command(name, context_settings=getattr(target, "context_settings", None))(target)
        command = typer.main.get_command(single)
    command.name = name
    return command


class LazyGroup(TyperGroup):
    """The top-level group: each subcommand imported on first use; the help lists the summaries."""

    _listing = False

    def list_commands(self, ctx) -> list[str]:
        return list(_TARGETS)

    def get_command(self, ctx, cmd_name: str):
        if cmd_name not in _TARGETS:
            return None
        if self._listing:  # the help's list of commands needs only each one's summary
            return TyperCommand(name=cmd_name, help=_SUMMARIES[cmd_name])
        if cmd_name not in self.commands:
            self.commands[cmd_name] = load_command(cmd_name)
        return self.commands[cmd_name]

    def format_help(self, ctx, formatter) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(
    name="fsched",
    cls=LazyGroup,
    help="A fair scheduler for local LLM inference: submit JSONL jobs, watch them share one model.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _main() -> None:
    """A callback, so that typer keeps a group of the subcommands it does not know of yet."""


if __name__ == "__main__":
    app()
