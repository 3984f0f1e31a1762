"""`fsched vllm-front`: start fsched's front for vLLM's engine core with vLLM's own python.

The front (core/runners/vllm_front.py) imports vLLM and nothing of fsched,
so it runs in the environment vLLM is installed in; this command finds that
python and hands the process over to it (the same process id: a service
manager's signals reach the front).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Annotated

import typer

from fsched.cli.common import fail, handle_errors
from fsched.core.runners import vllm_front

PythonOption = Annotated[str | None, typer.Option(
    "--python",
    help="The python of vLLM's environment (default: $FSCHED_VLLM_PYTHON, else python3 on PATH).")]
HostOption = Annotated[str, typer.Option("--host", help="The address daemons connect to.")]
PortOption = Annotated[int, typer.Option("--port", help="The port daemons connect to (front://HOST:PORT).")]
MetricsPortOption = Annotated[int | None, typer.Option(
    "--metrics-port", help="Serve GET /metrics (Prometheus: the front's counts and the engine core's figures "
                           "under vLLM's names) and GET /health on this port.")]
MetricsHostOption = Annotated[str | None, typer.Option(
    "--metrics-host", help="The metrics' address (default: --host).")]


@handle_errors
def vllm_front_command(
    ctx: typer.Context,
    python: PythonOption = None,
    host: HostOption = "127.0.0.1",
    port: PortOption = 8200,
    metrics_port: MetricsPortOption = None,
    metrics_host: MetricsHostOption = None,
) -> None:
    """Serve vLLM's engine core to fsched daemons (--engine front://HOST:PORT), with no HTTP in between.

    The arguments after `--` are vLLM's engine arguments, as `vllm serve` takes them:

        fsched vllm-front --python ~/vllm-env/bin/python --port 8200 -- --model DIR --max-num-seqs 256
    """
    python = python or os.environ.get("FSCHED_VLLM_PYTHON") or shutil.which("python3")
    if not python or not shutil.which(python):
        fail(f"no python to run vLLM with ({python or 'none found'}): "
             "give --python PATH of vLLM's environment")
    script = Path(vllm_front.__file__)
    metrics = [] if metrics_port is None else ["--metrics-port", str(metrics_port),
                                               *(["--metrics-host", metrics_host] if metrics_host else [])]
    args = [python, str(script), "--host", host, "--port", str(port), *metrics, *ctx.args]
    os.execv(shutil.which(python), args)


# vLLM's engine arguments follow fsched's options, as they are: click neither parses nor refuses them.
vllm_front_command.context_settings = {"allow_extra_args": True, "ignore_unknown_options": True}
