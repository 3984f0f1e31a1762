"""`fsched daemon`: load the model and serve the job table until stopped."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

import typer

from fsched.cli.common import DbOption, UserError, acting_user, allow, handle_errors, open_store

POLICIES = ("fsched", "fcfs", "priority", "vtc")


@handle_errors
def daemon(
    model: Annotated[
        str | None,
        typer.Option(
            "--model", "-m", help="Model folder or cached hub id (default: the built-in tiny random model); "
            "'standin' or 'standin:<ms>' runs a deterministic stand-in without a model (tests, rehearsals)."
        ),
    ] = None,
    device: Annotated[
        str, typer.Option("--device", help="auto (CUDA when present), cpu, cuda, cuda:N.")
    ] = "auto",
    dtype: Annotated[
        str, typer.Option("--dtype", help="auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16, float16.")
    ] = "auto",
    executor: Annotated[
        str,
        typer.Option(
            "--engine", help="hf: run the model here (default). An OpenAI-compatible engine's URL "
            "(e.g. http://127.0.0.1:8000 of `vllm serve`): fsched schedules, that engine executes; "
            "--model then names the model folder whose tokenizer encodes the prompts."
        ),
    ] = "hf",
    policy: Annotated[str, typer.Option("--policy", help="fsched, fcfs, priority or vtc.")] = "fsched",
    max_batch: Annotated[
        int | None,
        typer.Option("--max-batch", help="Requests in the running batch (default: 32 on CPU, 64 on CUDA; "
                     "with --engine URL: the engine's max_num_seqs where it says, else 64)."),
    ] = None,
    kv_tokens: Annotated[
        int | None,
        typer.Option(
            "--kv-tokens", help="KV cache budget in tokens (default: 32768 on CPU, 131072 on CUDA)."
        ),
    ] = None,
    step_tokens: Annotated[
        int | None,
        typer.Option(
            "--step-tokens",
            help="Tokens a step processes, decodes plus prefill chunks (default: 512 on CPU, 2048 on CUDA).",
        ),
    ] = None,
    threads: Annotated[int | None, typer.Option("--threads", help="CPU threads for torch.")] = None,
    until_idle: Annotated[bool, typer.Option("--until-idle", help="Exit when no work is left.")] = False,
    lease_ttl: Annotated[
        float,
        typer.Option(
            "--lease-ttl",
            help="Seconds a claimed request stays leased without a heartbeat; after that another "
            "daemon on the same (PostgreSQL) queue takes it over.",
        ),
    ] = 10.0,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only warnings and errors.")] = False,
    db: DbOption = None,
) -> None:
    """Run the scheduler and the model over the job table: continuous batching, fairly."""
    if policy not in POLICIES:
        raise UserError(f"--policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    logging.basicConfig(
        level=logging.WARNING if quiet else logging.INFO,
        stream=sys.stderr,
        format="fsched daemon: %(message)s",
    )
    log = logging.getLogger("fsched.daemon")
    store = open_store(db)
    if store.db.dialect == "sqlite":
        # The daemon reads every tenant's prompts and writes every output: on a
        # shared SQLite table that is an admin's job. (On PostgreSQL, holding
        # the database URL's credentials is what lets a daemon in.)
        from fsched.core.jobs.access import may_administer

        allow(may_administer(acting_user(store), "serving the job table (fsched daemon)"))
    lock = store.db.daemon_lock()

    from fsched.core.runners.standin import StandInError, parse_standin
    from fsched.core.sched.config import SchedulerConfig
    from fsched.core.sched.scheduler import Scheduler
    from fsched.core.serve.daemon import Daemon, DaemonConfig
    from fsched.core.serve.engine import Engine

    try:
        standin_step_s = parse_standin(model)
    except StandInError as exc:
        raise UserError(str(exc)) from None
    if executor != "hf":
        served = make_remote_runner(executor, model, log)
    elif standin_step_s is not None:
        served = _standin_model(standin_step_s, device)
    else:
        served = _torch_model(model, device, dtype, threads, log)
    config = SchedulerConfig(
        max_batch=max_batch or served.max_batch or (64 if served.gpu else 32),
        kv_tokens=kv_tokens or served.kv_tokens or (131_072 if served.gpu else 32_768),
        step_tokens=step_tokens or served.step_tokens or (2048 if served.gpu else 512),
        **{k: v for k, v in (("host_kv_tokens", served.host_kv_tokens),
                             ("min_quantum_steps", served.min_quantum_steps)) if v is not None},
    )
    scheduler = Scheduler(config, policy, store.tenant_weights())
    engine = Engine(served.runner, scheduler, served.context_length)
    if not lease_ttl > 2.0:
        raise UserError(f"--lease-ttl must be more than 2 seconds (two heartbeats), got {lease_ttl:g}")
    owner = f"{socket.gethostname()}:{served.device}:{os.getpid()}:{uuid.uuid4().hex[:4]}"
    the_daemon = Daemon(
        store,
        engine,
        served.encode,
        DaemonConfig(
            owner=owner,
            host=socket.gethostname(),
            pid=os.getpid(),
            device=served.device,
            model=served.name,
            policy=policy,
            claim_per_group=2 * config.max_batch,
            until_idle=until_idle,
            exclusive=lock is not None,
            lease_s=lease_ttl,
        ),
    )

    def stop(signum, _frame) -> None:
        log.info("%s: finishing the step, saving progress", signal.Signals(signum).name)
        the_daemon.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info(
        "serving %s with %s: model %s, policy %s, max batch %d, KV %d tokens, step %d tokens",
        store.db.display_url,
        owner,
        served.description,
        policy,
        config.max_batch,
        config.kv_tokens,
        config.step_tokens,
    )
    try:
        the_daemon.run()
    finally:
        if lock is not None:
            lock.release()
    s = the_daemon.stats
    log.info("stopped after %d steps, %d tokens", s.steps, s.tokens)
    if executor != "hf":
        r = served.runner
        log.info("engine streams: %d opened, %d resumed, %d outage(s)",
                 r.streams_opened, r.resumes, r.outages)


@dataclass(slots=True)
class _Served:
    """What the daemon serves with: a runner, its encoder and how to name it."""

    runner: object
    encode: Callable
    name: str
    description: str
    device: str
    context_length: int
    gpu: bool
    # Budgets the executor knows better than the defaults (a remote engine's batch and KV cache).
    max_batch: int | None = None
    kv_tokens: int | None = None
    step_tokens: int | None = None
    host_kv_tokens: int | None = None
    min_quantum_steps: int | None = None


def _torch_model(model: str | None, device: str, dtype: str, threads: int | None, log) -> _Served:
    from fsched.core.runners.hf.model import ModelLoadError, encode_prompt, load_model, set_threads
    from fsched.core.runners.hf.runner import ModelRunner

    if threads:
        set_threads(threads)
    log.info("loading %s ...", model or "the built-in tiny model")
    try:
        loaded = load_model(model, device=device, dtype=dtype)
    except ModelLoadError as exc:
        raise UserError(str(exc)) from None
    return _Served(
        runner=ModelRunner(loaded),
        encode=lambda claimed: encode_prompt(loaded, claimed.prompt, claimed.messages),
        name=loaded.name,
        description=loaded.describe(),
        device=str(loaded.device),
        context_length=loaded.context_length,
        gpu=loaded.device.type == "cuda",
    )


def _standin_model(step_s: float, device: str) -> _Served:
    from fsched.core.runners.standin import STANDIN_NAME, StandInRunner, standin_encode

    runner = StandInRunner(step_s=step_s)
    label = "standin" if device == "auto" else device
    return _Served(
        runner=runner,
        encode=lambda claimed: standin_encode(claimed.prompt, claimed.messages),
        name=STANDIN_NAME,
        description=f"{STANDIN_NAME}, {step_s * 1000:g} ms a step",
        device=label,
        context_length=runner.context_length,
        gpu=False,
    )


def make_remote_runner(url: str, model: str | None, log) -> _Served:
    """A runner over the OpenAI-compatible engine at `url`; `model` gives the tokenizer.

    The engine's batch (`max_num_seqs`) and KV cache (blocks x block size) become
    the scheduler's budgets where its metrics say them; a preempted request's KV
    is never parked (the engine keeps none for fsched): it resumes by a new call.
    """
    from fsched.core.runners.openai_http import EngineClient, EngineHTTPError
    from fsched.core.runners.remote import Codec, RemoteRunner
    from fsched.core.runners.standin import (
        STANDIN_EOS,
        STANDIN_NAME,
        parse_standin,
        standin_encode,
        standin_text,
    )

    try:
        client = EngineClient(url)
        info = client.info()
    except (ValueError, EngineHTTPError) as exc:
        raise UserError(f"--engine {url}: {exc}") from None
    if parse_standin(model) is not None:
        name, context, encode = STANDIN_NAME, 8192, lambda c: standin_encode(c.prompt, c.messages)
        decode, eos = standin_text, frozenset({STANDIN_EOS})
    else:
        from fsched.core.runners.hf.model import ModelLoadError, encode_prompt
        from fsched.core.runners.hf.tokenizer import load_tokenizer

        try:
            tok = load_tokenizer(model)
        except ModelLoadError as exc:
            raise UserError(str(exc)) from None
        name, context, decode, eos = tok.name, tok.context_length, tok.decode, tok.eos_token_ids
        encode = lambda c: encode_prompt(tok, c.prompt, c.messages)  # noqa: E731
    context = min(context, info.max_model_len or context)
    log.info("engine %s serves %s (context %d, KV %s tokens, batch %s)", client.url, info.model, context,
             info.kv_tokens or "unknown", info.max_num_seqs or "unknown")
    runner = RemoteRunner(client, Codec(decode, eos, context), info.model)
    return _Served(
        runner=runner, encode=encode, name=name, description=f"{name} on {client.url} ({info.model})",
        device=client.url, context_length=context, gpu=False, max_batch=info.max_num_seqs or 64,
        kv_tokens=info.kv_tokens, step_tokens=8192, host_kv_tokens=0,
        # A step here gathers what the engine produced since the last one (several of its
        # iterations): two steps of progress are the minimum quantum before a preemption.
        min_quantum_steps=2,
    )
