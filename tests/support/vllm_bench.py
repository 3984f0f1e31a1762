"""Run vLLM's serving benchmark client (`vllm bench serve`) from its own environment.

Run with the vLLM environment's python (the `vllm` console command fails for
the CPU build): `python tests/support/vllm_bench.py ARGS...` takes the
arguments of `vllm bench serve` and prints its result as one JSON line last.
fsched imports nothing of vLLM; this file runs only in vLLM's environment.
"""

from __future__ import annotations

import json
import sys


def run(argv: list[str]) -> dict:
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    return main(parser.parse_args(argv))


if __name__ == "__main__":
    result = run(sys.argv[1:])
    print(json.dumps({k: v for k, v in result.items() if isinstance(v, int | float | str)}))
