"""The composition root: settings validated once, defaults stated once, the runner chosen by kind."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from fsched.cli.main import app
from fsched.core.daemon.build import (
    CPU_LIMITS,
    DEFAULTS,
    GPU_LIMITS,
    RUNNER_KINDS,
    DaemonSettings,
    RunnerChoice,
    RunnerKind,
    SettingsError,
    StepLimits,
    build_daemon,
    make_runner,
)
from fsched.core.daemon.loop import DaemonConfig
from fsched.core.runners.standin import STANDIN_NAME, StandInRunner, standin_encode
from fsched.core.sched.config import SchedulerConfig


class Weights:
    """The one store call the builder makes (the daemon's own calls come when it runs)."""

    def tenant_weights(self) -> dict[str, float]:
        return {"alice": 3.0, "bob": 1.0}


@pytest.mark.parametrize("changes, setting", [
    ({"policy": "round-robin"}, "policy"),
    ({"model": "standin:fast"}, "model"),
    ({"max_batch": 0}, "max_batch"),
    ({"kv_tokens": -5}, "kv_tokens"),
    ({"threads": 0}, "threads"),
    ({"lease_s": 1.5}, "lease_s"),  # two heartbeats or less: live daemons would lose their leases
    ({"lease_s": float("nan")}, "lease_s"),
])
def test_a_bad_setting_is_refused_by_name(changes, setting):
    with pytest.raises(SettingsError) as error:
        DaemonSettings(**changes)
    assert error.value.setting == setting


def test_defaults_come_from_the_configs_that_state_them():
    assert DEFAULTS.lease_s == DaemonConfig(owner="", host="", pid=0, device="", model="", policy="").lease_s
    gpu = SchedulerConfig()
    assert GPU_LIMITS == StepLimits(gpu.max_batch, gpu.kv_tokens, gpu.step_tokens)
    assert DEFAULTS.limits(gpu=True) == GPU_LIMITS and DEFAULTS.limits(gpu=False) == CPU_LIMITS
    assert DaemonSettings(max_batch=8).limits(gpu=False) == StepLimits(8, CPU_LIMITS.kv_tokens,
                                                                       CPU_LIMITS.step_tokens)


def test_the_stand_in_kind_serves_a_standin_spec():
    chosen = make_runner(DaemonSettings(model="standin:5ms"))
    assert isinstance(chosen.runner, StandInRunner) and chosen.runner.step_s == 0.005
    assert (chosen.name, chosen.device, chosen.gpu) == (STANDIN_NAME, "standin", False)
    assert [kind.name for kind in RUNNER_KINDS][-1] == "model"  # the model takes whatever is left


def test_the_first_kind_that_claims_the_settings_serves():
    remote = RunnerChoice(StandInRunner(), "remote", "a remote engine", "remote", gpu=True)
    kinds = (RunnerKind("remote", lambda s: s.device == "remote", lambda s: remote), *RUNNER_KINDS)
    assert make_runner(DaemonSettings(device="remote"), kinds) is remote
    assert make_runner(DaemonSettings(model="standin"), kinds).name == STANDIN_NAME


def test_build_daemon_wires_settings_runner_scheduler_and_store():
    settings = DaemonSettings(model="standin", policy="vtc", lease_s=6.0, until_idle=True, link="off")
    daemon = build_daemon(settings, Weights(), exclusive=True)
    config = daemon.config
    assert (config.model, config.device, config.policy) == (STANDIN_NAME, "standin", "vtc")
    assert config.lease_s == 6.0
    assert config.until_idle and config.exclusive
    assert daemon.engine.max_batch == CPU_LIMITS.max_batch
    assert config.owner.split(":")[1] == "standin"
    claimed = SimpleNamespace(prompt_text="hello there", messages=None, render=None)
    assert daemon.encode(claimed) == standin_encode("hello there")


@pytest.mark.parametrize("args, message", [
    (["--policy", "round-robin"], "--policy: must be one of"),
    (["--lease-ttl", "1"], "--lease-ttl: 1 s is refused"),
    (["--model", "standin:fast", "--max-batch", "4"], "--model: 'standin:fast'"),
    (["--max-batch", "0"], "--max-batch: must be a positive integer"),
    (["--batch-stream-interval", "0"], "--batch-stream-interval: must be a positive integer"),
])
def test_the_command_names_the_option_of_a_bad_setting(args, message, tmp_path):
    db = tmp_path / "never.db"
    result = CliRunner().invoke(app, ["daemon", *args, "--db", str(db)])
    assert result.exit_code == 1 and message in result.stderr, result.stderr
    assert not db.exists()  # refused before the job table is opened
