"""The isolated worker: a process that compiles grammars under a CPU-time, memory and stack budget.

Run as `python -m fsched.core.grammar.worker IN_FD OUT_FD CPU_S MEMORY_BYTES STACK_BYTES`; it reads
jobs (a source's kind and text) from IN_FD and answers each on OUT_FD, one message each way, as
`multiprocessing.connection` frames them. A job over its CPU time is killed by the kernel (SIGXCPU),
one over its memory or stack crashes: the parent sees the process end and says so.
"""

from __future__ import annotations

import json
import math
import os
import resource
import sys
from multiprocessing.connection import Connection

from fsched.core.grammar.llg import compiled_text
from fsched.core.grammar.source import GrammarError, GrammarSource, SourceKind

READY = b"ready"
NICENESS = 10  # below the server's: on a busy CPU a compile waits, the event loop does not


def limit_memory(memory_bytes: int, stack_bytes: int) -> None:
    """This process's address space and main-thread stack, for good."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_STACK, (stack_bytes, stack_bytes))


def limit_cpu(cpu_s: float) -> None:
    """At most `cpu_s` more CPU seconds from now (the limit counts the process's whole life)."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(used.ru_utime + used.ru_stime + cpu_s)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, resource.RLIM_INFINITY))


def answer(job: dict) -> dict:
    """One job's verdict: the compiled grammar's text, or why not."""
    try:
        return {"grammar": compiled_text(GrammarSource(SourceKind(job["kind"]), job["text"]))}
    except GrammarError as exc:
        return {"error": str(exc)}


def serve(jobs: Connection, answers: Connection, cpu_s: float) -> None:
    answers.send_bytes(READY)
    while True:
        try:
            job = json.loads(jobs.recv_bytes())
        except EOFError:
            return
        limit_cpu(cpu_s)
        answers.send_bytes(json.dumps(answer(job)).encode())


def main(argv: list[str]) -> None:
    in_fd, out_fd, cpu_s, memory, stack = argv
    os.nice(NICENESS)
    limit_memory(int(memory), int(stack))
    serve(Connection(int(in_fd), writable=False), Connection(int(out_fd), readable=False), float(cpu_s))


if __name__ == "__main__":
    main(sys.argv[1:])
