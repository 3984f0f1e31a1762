"""A real vLLM OpenAI server (CPU build) for the end-to-end tests and the benchmark.

vLLM lives in its own virtual environment (scripts/vllm_env.sh creates it once,
outside the repository, and prints its python): fsched imports nothing of it.
The server is started as

    VLLM_CPU_KVCACHE_SPACE=1 python -m vllm.entrypoints.openai.api_server --model DIR \\
        --dtype float32 --enforce-eager --gpu-memory-utilization 0.3

(the `vllm` console command fails for this build), about 30 s to serve.
Models are built here, offline: the tiny Llama fsched builds itself, and a
GPT-2 style model (GPT2Config, random init) that reuses the tiny tokenizer.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]


def vllm_python() -> str:
    """The vLLM environment's python: $FSCHED_VLLM_PYTHON, else created (once) by scripts/vllm_env.sh."""
    if os.environ.get("FSCHED_VLLM_PYTHON"):
        return os.environ["FSCHED_VLLM_PYTHON"]
    out = subprocess.run(["bash", str(REPO / "scripts" / "vllm_env.sh")], check=True, capture_output=True,
                         text=True, timeout=3600)
    return out.stdout.strip().splitlines()[-1]


def build_gpt2_model(folder: Path, tokenizer_from: Path, seed: int = 20261201) -> Path:
    """A small random GPT-2 (4 layers, 256 wide) with the tiny model's tokenizer, saved to `folder`."""
    if (folder / "config.json").exists():
        return folder
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_from)
    config = GPT2Config(
        vocab_size=len(tokenizer), n_positions=1024, n_embd=256, n_layer=4, n_head=4,
        # As for the tiny Llama: the usual 0.02 makes a random model repeat one token.
        initializer_range=0.1,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config)
    staging = folder.with_name(folder.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    staging.rename(folder)
    return folder


def _lower_session_priority(pid: int, nice: int) -> None:
    """Lower the CPU priority of the server's whole session, not only of its processes.

    Linux schedules sessions as groups (autogroup): a plain `nice` ranks the
    server's processes only among themselves, and the server, alone in its
    session, would still get an equal share against the client's session.
    """
    try:
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))
    except OSError:
        pass  # no autogroup (or not Linux): the process nice is all there is


class VllmServer:
    """One vLLM server process on a loopback port; `restart()` kills it hard and starts it again."""

    def __init__(self, model: Path, log_path: Path, port: int | None = None, extra: tuple[str, ...] = (),
                 python: str | None = None, nice: int = 0):
        self.model, self.log_path, self.extra, self.nice = model, log_path, extra, nice
        self.port = port or free_port()
        self.python = python or vllm_python()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 300) -> VllmServer:
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
        log = open(self.log_path, "ab")
        niced = ["nice", "-n", str(self.nice)] if self.nice else []
        self.proc = subprocess.Popen(
            [*niced, self.python, *self.entry(), "--model", str(self.model),
             "--dtype", "float32", "--enforce-eager", "--gpu-memory-utilization", "0.3",
             "--port", str(self.port), "--host", "127.0.0.1", *self.extra],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        if self.nice:
            _lower_session_priority(self.proc.pid, self.nice)
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode}; see {self.log_path}")
            if self.ready():
                return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"vLLM did not serve within {timeout_s:.0f} s; see {self.log_path}")

    def entry(self) -> list[str]:
        """What the python runs."""
        return ["-m", "vllm.entrypoints.openai.api_server"]

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        """Kill the server's whole process group (the API server and its engine core)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=60)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def metrics(self) -> dict[str, float]:
        """The server's counters, summed over labels (e.g. vllm:prefix_cache_hits_total)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("#") or " " not in line:
                continue
            name, _, value = line.rpartition(" ")
            key = name.split("{")[0]
            try:
                out[key] = out.get(key, 0.0) + float(value)
            except ValueError:
                pass
        return out

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class VllmFront(VllmServer):
    """fsched's front for vLLM's engine core (core/runners/vllm_front.py) instead of vLLM's API server,
    started the same way (vLLM's python, the same engine arguments); daemons reach it at `url`."""

    @property
    def url(self) -> str:
        return f"front://127.0.0.1:{self.port}"

    def entry(self) -> list[str]:
        return [str(REPO / "core" / "runners" / "vllm_front.py")]

    def ready(self) -> bool:
        from fsched.core.runners.front_link import FrontClient

        return FrontClient(self.url, connect_timeout_s=2).healthy()
