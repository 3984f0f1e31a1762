"""The composition root: the daemon's settings in, a Daemon ready to run out.

Every default a daemon starts with is stated here or in the config it comes
from (the scheduler's, the daemon's), once: the `fsched daemon` command
reads its option defaults from `DEFAULTS` and only parses and calls
`build_daemon`. Which runner serves is chosen by `make_runner` from
`RUNNER_KINDS`; a new kind of runner joins with one entry there.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace

from fsched.core.daemon.loop import Daemon, DaemonConfig
from fsched.core.ports.queue import QueueStore
from fsched.core.runners.connect import ENGINE_APIS
from fsched.core.runners.protocol import Runner
from fsched.core.runners.standin import StandInError, parse_standin
from fsched.core.sched.config import SchedulerConfig
from fsched.core.sched.policy import POLICIES

log = logging.getLogger("fsched.daemon")


class SettingsError(ValueError):
    """A daemon setting that cannot be used; `setting` names the field."""

    def __init__(self, setting: str, message: str):
        super().__init__(message)
        self.setting = setting


class RunnerUnavailable(Exception):
    """The runner the settings ask for cannot be made (a model that does not load, a device not here)."""


@dataclass(slots=True, frozen=True)
class StepLimits:
    """What one engine step may hold: the scheduler's three device-sized limits."""

    max_batch: int
    kv_tokens: int | None
    step_tokens: int


# A GPU daemon takes the scheduler's own defaults, which describe one modern GPU.
_GPU = SchedulerConfig()
GPU_LIMITS = StepLimits(_GPU.max_batch, _GPU.kv_tokens, _GPU.step_tokens)
# A CPU computes a forward at a cost close to its token count and has far less memory bandwidth and
# KV room, so its limits are a quarter to a half of the GPU's: 32 rows already give most of what
# batching gains there; 32k KV tokens hold 32 requests of 1k context; 512-token steps keep a prefill
# step short enough that the decoding rows are not held up long behind it.
CPU_LIMITS = StepLimits(max_batch=32, kv_tokens=32_768, step_tokens=512)


def _daemon_default(name: str):
    """A DaemonConfig field's default: the daemon's config states it, with its reason."""
    return next(f.default for f in fields(DaemonConfig) if f.name == name)


@dataclass(slots=True)
class DaemonSettings:
    """What `fsched daemon` is told; validated on construction, so a bad value fails before a model loads."""

    # What serves: None is the built-in tiny model (it builds offline, so a fresh install runs);
    # a model folder or a cached hub id; "standin" or "standin:<ms>" the deterministic stand-in.
    model: str | None = None
    # auto: CUDA when present, else the CPU, so a machine with a GPU uses it without being told.
    device: str = "auto"
    # auto: bf16 on CUDA (half the memory of fp32, the precision models are trained in), fp32 on a
    # CPU (where bf16 kernels are slow).
    dtype: str = "auto"
    # fsched's own ordering; the single-purpose policies are there to compare it against.
    policy: str = "fsched"
    # Step limits; None takes the device's (GPU_LIMITS or CPU_LIMITS).
    max_batch: int | None = None
    kv_tokens: int | None = None
    step_tokens: int | None = None
    # CPU threads for torch; None leaves torch's choice (one per core).
    threads: int | None = None
    # Exit when no work is left, for one-shot runs and tests; a service runs until stopped.
    until_idle: bool = False
    # Seconds a claimed request stays leased without a heartbeat (the daemon's config says why).
    lease_s: float = _daemon_default("lease_s")
    # "hf": run the model in this process. An http(s) URL: an OpenAI-compatible engine that takes
    # token-id prompts (vLLM) executes, fsched schedules; `model` then names the folder whose
    # tokenizer encodes prompts (or "standin" for the stand-in engine's ids).
    engine: str = "hf"
    # Where HTTP servers reach this daemon for pushed wake-ups and tokens (core/daemon/link.py):
    # HOST:PORT (port 0: any free one; the heartbeat says which), or "off" (they read the table).
    # Loopback by default: a server on another machine needs a reachable address.
    link: str = "127.0.0.1:0"
    # With a remote engine: how the daemon asks it for tokens ("auto", "tokens", "completions" or "front";
    # core/runners/connect.py): auto takes the engine's token interface where it serves one, and the
    # front at a front:// URL.
    engine_api: str = "auto"
    # With a remote engine: a batch request's tokens come from it this many a chunk (the first at once).
    # Nobody reads them one at a time (the table gets them about once a second), and every chunk costs
    # the engine's front end and the daemon alike; 1 asks for each token on its own.
    batch_stream_interval: int = 8

    def __post_init__(self) -> None:
        if self.link != "off":
            host, _, port = self.link.rpartition(":")
            if not host or not port.isdigit() or int(port) > 65535:
                raise SettingsError("link", f"must be HOST:PORT or off, got {self.link!r}")
        if self.policy not in POLICIES:
            raise SettingsError("policy", f"must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        try:
            parse_standin(self.model)
        except StandInError as exc:
            raise SettingsError("model", str(exc)) from None
        for name in ("max_batch", "kv_tokens", "step_tokens", "threads", "batch_stream_interval"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise SettingsError(name, f"must be a positive integer, got {value!r}")
        if self.engine != "hf" and not self.engine.startswith(("http://", "https://", "front://")):
            raise SettingsError("engine", "must be hf, an http(s) URL of an engine or the front:// URL of "
                                f"fsched's vLLM front, got {self.engine!r}")
        if self.engine_api not in ENGINE_APIS:
            raise SettingsError("engine_api",
                                f"must be one of {', '.join(ENGINE_APIS)}, got {self.engine_api!r}")
        if self.engine.startswith("front://") and self.engine_api not in ("auto", "front"):
            raise SettingsError("engine_api", f"a front:// engine speaks front, not {self.engine_api}")
        if self.engine_api == "front" and not self.engine.startswith("front://"):
            raise SettingsError("engine_api", "front speaks to fsched's vLLM front: give --engine front://HOST:PORT")
        if not math.isfinite(self.lease_s):
            raise SettingsError("lease_s", f"must be a finite number of seconds, got {self.lease_s!r}")
        try:
            daemon_config(self)
        except ValueError as exc:
            raise SettingsError("lease_s", f"{self.lease_s:g} s is refused: {exc}") from None

    def limits(self, gpu: bool, engine: StepLimits | None = None) -> StepLimits:
        """The step limits: each one set, else what the engine says, else the device's default."""
        device = GPU_LIMITS if gpu else CPU_LIMITS

        def pick(name: str) -> int:
            said = getattr(engine, name) if engine is not None else None
            return getattr(self, name) or said or getattr(device, name)

        return StepLimits(
            max_batch=pick("max_batch"), kv_tokens=pick("kv_tokens"), step_tokens=pick("step_tokens")
        )


def daemon_config(settings: DaemonSettings) -> DaemonConfig:
    """The daemon's config from what is known before the model loads; `build_daemon` adds the rest."""
    return DaemonConfig(
        owner="", host=socket.gethostname(), pid=os.getpid(), device=settings.device,
        model=settings.model or "", policy=settings.policy, until_idle=settings.until_idle,
        lease_s=settings.lease_s,
    )


DEFAULTS = DaemonSettings()  # the command's option defaults read these


# -- which runner serves -------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class RunnerChoice:
    """A runner and how the daemon names it (its row in the job table, its log)."""

    runner: Runner
    name: str
    description: str
    device: str
    gpu: bool
    # A remote engine knows its own batch and KV budget better than the device defaults.
    limits: StepLimits | None = None
    # Scheduler settings that differ for this runner (a remote engine keeps no parked KV).
    scheduler: dict = field(default_factory=dict)


@dataclass(slots=True, frozen=True)
class RunnerKind:
    """One way to serve: `claims` says whether the settings ask for it, `build` makes it."""

    name: str
    claims: Callable[[DaemonSettings], bool]
    build: Callable[[DaemonSettings], RunnerChoice]


def _standin_runner(settings: DaemonSettings) -> RunnerChoice:
    from fsched.core.runners.standin import STANDIN_NAME, StandInRunner

    step_s = parse_standin(settings.model) or 0.0
    return RunnerChoice(
        runner=StandInRunner(step_s=step_s),
        name=STANDIN_NAME,
        description=f"{STANDIN_NAME}, {step_s * 1000:g} ms a step",
        device="standin" if settings.device == "auto" else settings.device,
        gpu=False,
    )


def _model_runner(settings: DaemonSettings) -> RunnerChoice:
    from fsched.core.runners.hf.model import ModelLoadError, load_model, set_threads
    from fsched.core.runners.hf.runner import ModelRunner

    if settings.threads:
        set_threads(settings.threads)
    log.info("loading %s ...", settings.model or "the built-in tiny model")
    try:
        loaded = load_model(settings.model, device=settings.device, dtype=settings.dtype)
    except ModelLoadError as exc:
        raise RunnerUnavailable(str(exc)) from None
    return RunnerChoice(
        runner=ModelRunner(loaded),
        name=loaded.name,
        description=loaded.describe(),
        device=str(loaded.device),
        gpu=loaded.device.type == "cuda",
    )


def _remote_runner(settings: DaemonSettings) -> RunnerChoice:
    from fsched.core.runners.connect import connect_remote_engine

    try:
        remote = connect_remote_engine(settings.engine, settings.model, settings.engine_api,
                                       batch_stream_interval=settings.batch_stream_interval)
    except ValueError as exc:
        raise RunnerUnavailable(f"--engine {settings.engine}: {exc}") from None
    return RunnerChoice(
        runner=remote.runner, name=remote.name, description=remote.description, device=remote.url,
        gpu=False, limits=StepLimits(remote.max_batch, remote.kv_tokens, remote.step_tokens),
        # The engine keeps no parked KV, and composes its own iterations (no prefill cut for it).
        scheduler={"host_kv_tokens": 0, "min_quantum_steps": remote.min_quantum_steps,
                   "cut_prefill_for_first_token": False},
    )


# The first kind that claims the settings serves: a remote engine when one is named, then the
# stand-in, then the model (which claims whatever is left).
RUNNER_KINDS: tuple[RunnerKind, ...] = (
    RunnerKind("remote", lambda s: s.engine != "hf", _remote_runner),
    RunnerKind("standin", lambda s: parse_standin(s.model) is not None, _standin_runner),
    RunnerKind("model", lambda s: True, _model_runner),
)


def make_runner(settings: DaemonSettings, kinds: tuple[RunnerKind, ...] = RUNNER_KINDS) -> RunnerChoice:
    return next(kind for kind in kinds if kind.claims(settings)).build(settings)


# -- the daemon ------------------------------------------------------------------------------------


def build_daemon(settings: DaemonSettings, store: QueueStore, exclusive: bool) -> Daemon:
    """A Daemon over `store`, serving with the runner the settings choose.

    `exclusive`: this daemon is the only one on the job table (it holds the
    table's lock), so at start it may take back everything left running.
    """
    from fsched.core.daemon.engine import Engine
    from fsched.core.sched.scheduler import Scheduler

    config = daemon_config(settings)
    chosen = make_runner(settings)
    limits = settings.limits(chosen.gpu, chosen.limits)
    scheduler_config = SchedulerConfig(
        max_batch=limits.max_batch, kv_tokens=limits.kv_tokens, step_tokens=limits.step_tokens,
        **chosen.scheduler,
    )
    scheduler = Scheduler(scheduler_config, settings.policy, store.tenant_weights())
    engine = Engine(chosen.runner, scheduler, chosen.runner.context_length)
    owner = f"{config.host}:{chosen.device}:{config.pid}:{uuid.uuid4().hex[:4]}"
    config = replace(
        config, owner=owner, device=chosen.device, model=chosen.name, exclusive=exclusive,
    )
    log.info(
        "%s: model %s, policy %s, max batch %d, KV %d tokens, step %d tokens",
        owner, chosen.description, settings.policy, limits.max_batch, limits.kv_tokens, limits.step_tokens,
    )
    runner = chosen.runner

    def encode(request):
        return runner.encode(request.prompt_text, request.messages, request.render)

    return Daemon(store, engine, encode, config, link=_link(settings.link, config.host))


def _link(address: str, hostname: str):
    """The daemon's link server (None when turned off); bound to all addresses, it names the host."""
    if address == "off":
        return None
    from fsched.core.daemon.link import LinkServer

    host, _, port = address.rpartition(":")
    return LinkServer(host, int(port), advertise=hostname if host in ("0.0.0.0", "::") else None)


def runner_summary(daemon: Daemon) -> str | None:
    """A closing line about the runner's own traffic, where it has any (a remote engine's streams)."""
    from fsched.core.runners.remote import RemoteRunner

    runner = daemon.engine.runner
    if not isinstance(runner, RemoteRunner):
        return None
    return (
        f"engine streams: {runner.streams_opened} opened, {runner.resumes} resumed, "
        f"{runner.outage.count} outage(s)"
    )
