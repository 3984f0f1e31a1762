"""`fsched daemon`: parse the options, build the daemon (core/daemon/build.py), serve until stopped."""

from __future__ import annotations

import logging
import signal
import sys
from typing import Annotated

import typer

from fsched.cli.common import (
    DbOption,
    UserError,
    handle_errors,
    open_table_to_serve,
    quick_thread_handoffs,
    quiet_gc,
)
from fsched.core.daemon.build import (
    CPU_LIMITS,
    DEFAULTS,
    GPU_LIMITS,
    DaemonSettings,
    RunnerUnavailable,
    SettingsError,
)
from fsched.core.sched.policy import POLICIES

POLICY_NAMES = ", ".join(POLICIES)

# The option of each setting, for error messages.
OPTIONS = {
    "model": "--model", "device": "--device", "dtype": "--dtype", "policy": "--policy",
    "max_batch": "--max-batch", "kv_tokens": "--kv-tokens", "step_tokens": "--step-tokens",
    "threads": "--threads", "until_idle": "--until-idle", "lease_s": "--lease-ttl", "engine": "--engine",
    "link": "--link", "engine_api": "--engine-api", "batch_stream_interval": "--batch-stream-interval",
}


def _by_device(what: str, limit: str) -> str:
    return f"{what} (default: {getattr(CPU_LIMITS, limit)} on CPU, {getattr(GPU_LIMITS, limit)} on CUDA)."


ModelOption = Annotated[str | None, typer.Option(
    "--model", "-m", help="Model folder or cached hub id (default: the built-in tiny random model); "
    "'standin' or 'standin:<ms>' runs a deterministic stand-in without a model (tests, rehearsals).")]
DeviceOption = Annotated[str, typer.Option("--device", help="auto (CUDA when present), cpu, cuda, cuda:N.")]
DtypeOption = Annotated[str, typer.Option(
    "--dtype", help="auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16, float16, float64 (bit-stable "
    "outputs across batch shapes, for checks on CPU).")]
PolicyOption = Annotated[str, typer.Option("--policy", help=f"One of {POLICY_NAMES}.")]
MaxBatchOption = Annotated[int | None, typer.Option(
    "--max-batch", help=_by_device("Requests in the running batch", "max_batch"))]
KvTokensOption = Annotated[int | None, typer.Option(
    "--kv-tokens", help=_by_device("KV cache budget in tokens", "kv_tokens"))]
StepTokensOption = Annotated[int | None, typer.Option(
    "--step-tokens", help=_by_device("Tokens a step processes, decodes plus prefill chunks", "step_tokens"))]
ThreadsOption = Annotated[int | None, typer.Option("--threads", help="CPU threads for torch.")]
UntilIdleOption = Annotated[bool, typer.Option("--until-idle", help="Exit when no work is left.")]
LeaseOption = Annotated[float, typer.Option(
    "--lease-ttl", help="Seconds a claimed request stays leased without a heartbeat; after that another "
    "daemon on the same (PostgreSQL) queue takes it over.")]
LinkOption = Annotated[str, typer.Option(
    "--link", help="HOST:PORT where `fsched serve` connects for pushed wake-ups and tokens (port 0: any "
    "free one, published in the heartbeat); 'off': servers read the table only.")]
QuietOption = Annotated[bool, typer.Option("--quiet", "-q", help="Only warnings and errors.")]
EngineOption = Annotated[str, typer.Option(
    "--engine", help="hf: run the model in this process. An OpenAI-compatible engine's URL (e.g. "
    "http://127.0.0.1:8000 of vLLM), or front://HOST:PORT of fsched's front for vLLM's engine core (fsched "
    "vllm-front): fsched schedules, that engine executes; --model then names the model "
    "folder whose tokenizer encodes the prompts. --max-batch and --kv-tokens default to what the engine "
    "says (else 64 requests).")]

EngineApiOption = Annotated[str, typer.Option(
    "--engine-api", help="With --engine URL, how fsched asks the engine for tokens: tokens (vLLM's token "
    "interface, POST /inference/v1/generate: token ids in and out, nothing detokenized; vLLM serves it "
    "with --tokens-only), completions (/v1/completions with token-id prompts, any OpenAI-compatible "
    "engine), front (fsched's vLLM front, at a front:// URL), or auto: front at a front:// URL, tokens "
    "where the engine serves it, else completions.")]

BatchStreamIntervalOption = Annotated[int, typer.Option(
    "--batch-stream-interval", help="With --engine URL, how many of a batch-class request's tokens "
    "the engine sends a chunk (vLLM's stream_interval; the first and the last come at once): a "
    "batch's tokens reach the table about once a second, and each chunk costs the engine's API "
    "server and the daemon; a preempted batch request recomputes at most that many less one. 1: "
    "every token on its own. Realtime and streaming requests always get every token on its own.")]


@handle_errors
def daemon(
    model: ModelOption = DEFAULTS.model,
    device: DeviceOption = DEFAULTS.device,
    dtype: DtypeOption = DEFAULTS.dtype,
    engine: EngineOption = DEFAULTS.engine,
    engine_api: EngineApiOption = DEFAULTS.engine_api,
    batch_stream_interval: BatchStreamIntervalOption = DEFAULTS.batch_stream_interval,
    policy: PolicyOption = DEFAULTS.policy,
    max_batch: MaxBatchOption = DEFAULTS.max_batch,
    kv_tokens: KvTokensOption = DEFAULTS.kv_tokens,
    step_tokens: StepTokensOption = DEFAULTS.step_tokens,
    threads: ThreadsOption = DEFAULTS.threads,
    until_idle: UntilIdleOption = DEFAULTS.until_idle,
    lease_ttl: LeaseOption = DEFAULTS.lease_s,
    link: LinkOption = DEFAULTS.link,
    quiet: QuietOption = False,
    db: DbOption = None,
) -> None:
    """Run the scheduler and the model over the job table: continuous batching, fairly."""
    try:
        settings = DaemonSettings(
            model=model, device=device, dtype=dtype, policy=policy, max_batch=max_batch,
            kv_tokens=kv_tokens, step_tokens=step_tokens, threads=threads, until_idle=until_idle,
            lease_s=lease_ttl, engine=engine, link=link, engine_api=engine_api,
            batch_stream_interval=batch_stream_interval,
        )
    except SettingsError as exc:
        raise UserError(f"{OPTIONS[exc.setting]}: {exc}") from None
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, stream=sys.stderr,
                        format="fsched daemon: %(message)s")
    run_daemon(settings, db)


def run_daemon(settings: DaemonSettings, db: str | None) -> None:
    """Take the job table (as an admin on SQLite, alone where it has a lock) and serve it until stopped."""
    from fsched.core.daemon.build import build_daemon, runner_summary

    log = logging.getLogger("fsched.daemon")
    # The daemon reads every tenant's prompts and writes every output.
    table = open_table_to_serve(db, "serving the job table (fsched daemon)")
    lock = table.daemon_lock()
    try:
        try:
            the_daemon = build_daemon(settings, table.queue, exclusive=lock is not None)
        except RunnerUnavailable as exc:
            raise UserError(str(exc)) from None
        table.queue.prepare(the_daemon.engine.scheduler.config.max_batch)
        table.queue.keep_statistics()
        quiet_gc()
        quick_thread_handoffs()

        def stop(signum, _frame) -> None:
            log.info("%s: finishing the step, saving progress", signal.Signals(signum).name)
            the_daemon.stop()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        log.info("serving %s", table.display_url)
        the_daemon.run()
    finally:
        if lock is not None:
            lock.release()
    log.info("stopped after %d steps, %d tokens", the_daemon.figures.steps, the_daemon.figures.tokens)
    if summary := runner_summary(the_daemon):
        log.info("%s", summary)
