"""The `fsched` command: composes the subcommands, holds no logic of its own."""

from __future__ import annotations

import typer

from fsched.cli import keys, limits, tenants
from fsched.cli.daemon import daemon
from fsched.cli.demo import demo
from fsched.cli.generate import generate
from fsched.cli.jobs import cancel, purge, results
from fsched.cli.replay import replay
from fsched.cli.serve import serve
from fsched.cli.simulate import simulate
from fsched.cli.status import status
from fsched.cli.submit import submit

app = typer.Typer(
    name="fsched",
    help="A fair scheduler for local LLM inference: submit JSONL jobs, watch them share one model.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

app.command("submit")(submit)
app.command("status")(status)
app.command("cancel")(cancel)
app.command("results")(results)
app.command("purge")(purge)
app.add_typer(tenants.app, name="tenants")
app.add_typer(keys.app, name="keys")
app.add_typer(limits.app, name="limits")
app.command("daemon")(daemon)
app.command("simulate")(simulate)
app.command("replay")(replay)
app.command("generate")(generate)
app.command("demo")(demo)
app.command("serve")(serve)

if __name__ == "__main__":
    app()
