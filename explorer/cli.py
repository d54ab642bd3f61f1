"""The ``explore`` command: parse, call the core, print.  Nothing else lives here.

    explore operators
    explore profile OPERATOR SHAPE [--repeat N] [--memory-cap SIZE] [--timeout S] [--json]
    explore OPERATOR [--budget N] [--tolerance F] ...          (active-learning exploration)

Bad input ends with one line on stderr and a non-zero exit, never a traceback
(set ``EXPLORER_DEBUG=1`` to see one).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from explorer.units import format_bytes, format_shape, parse_shape, parse_size

EXIT_USAGE = 2
EXIT_FAILURE = 1


class CLIError(Exception):
    """A one-line error for the user."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not usage + message
        raise CLIError(f"{self.prog}: {message}")


def _shape(text: str) -> tuple[int, ...]:
    try:
        return parse_shape(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _operator_name(text: str) -> str:
    import operators

    if text not in operators.names():
        raise argparse.ArgumentTypeError(
            f"unknown operator {text!r}; known operators: {', '.join(operators.names())}"
        )
    return text


# -- explore operators -----------------------------------------------------
def _cmd_operators(argv: list[str]) -> int:
    parser = _Parser(prog="explore operators", description="List the registered operators.")
    parser.add_argument("--json", action="store_true", help="print one JSON list")
    args = parser.parse_args(argv)
    import operators

    rows = []
    for name in operators.names():
        op = operators.get(name)
        rows.append(
            {
                "name": name,
                "halo": list(op.halo),
                "whole_axes": list(op.whole_axes),
                "description": op.description,
            }
        )
    if args.json:
        print(json.dumps(rows))
        return 0
    axis_names = ("inline", "crossline", "samples")
    print(f"{'operator':<24} {'halo':<10} {'whole axes':<12} description")
    for row in rows:
        whole = ",".join(axis_names[a] for a in row["whole_axes"]) or "-"
        print(f"{row['name']:<24} {format_shape(row['halo']):<10} {whole:<12} {row['description']}")
    return 0


# -- explore profile -------------------------------------------------------
def _cmd_profile(argv: list[str]) -> int:
    parser = _Parser(
        prog="explore profile",
        description="Profile one operator at one shape in an isolated child process.",
    )
    parser.add_argument("operator", type=_operator_name)
    parser.add_argument("shape", type=_shape, help="like 200x200x200 (inline x crossline x samples)")
    parser.add_argument("--repeat", type=_positive_int, default=1, help="runs, each in a fresh child")
    parser.add_argument("--memory-cap", type=_size, default=None,
                        help="cap on the operator's working memory, like 2GiB (default: half this machine's memory)")
    parser.add_argument("--timeout", type=_positive_float, default=None, help="seconds per run")
    parser.add_argument("--seed", type=int, default=0, help="synthetic volume seed")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)

    from explorer.profiling import profile

    if not args.json:
        print(f"profiling {args.operator} at {format_shape(args.shape)} ({args.repeat} run(s))...", file=sys.stderr)
    m = profile(args.operator, args.shape, repeat=args.repeat, memory_cap=args.memory_cap,
                timeout=args.timeout, seed=args.seed)
    if args.json:
        print(json.dumps(m.to_dict()))
    else:
        voxels = 1
        for n in m.shape:
            voxels *= n
        print(f"operator        {m.operator}")
        print(f"shape           {format_shape(m.shape)} ({voxels:,} voxels, {m.dtype})")
        print(f"status          {m.status}" + (f" ({m.error})" if m.error else ""))
        if m.peak_bytes is not None:
            bound = "  (lower bound: the run hit the memory cap)" if m.status == "exceeded" else ""
            print(f"peak_bytes      {format_bytes(m.peak_bytes)}  = {m.peak_bytes / voxels:.1f} bytes/voxel{bound}")
            print(f"process peak    {format_bytes(m.process_peak_bytes)}")
        print(f"input / output  {format_bytes(m.input_bytes)} / "
              f"{format_bytes(m.output_bytes) if m.output_bytes is not None else '-'}")
        if m.seconds is not None:
            print(f"seconds         {m.seconds:.3f}  (profile overhead {m.overhead_seconds:.3f} s)")
        if len(m.repeats) > 1:
            peaks = [r.get('peak_bytes') for r in m.repeats if r.get('peak_bytes') is not None]
            print("repeats         " + ", ".join(format_bytes(p) for p in peaks))
        if m.gpu and m.gpu.get("note"):
            print(f"gpu             {m.gpu['note']}")
    # ok and exceeded are measurements (exceeded: a lower bound); timeout and error are not
    return 0 if m.status in ("ok", "exceeded") else EXIT_FAILURE


COMMANDS = {
    "operators": _cmd_operators,
    "profile": _cmd_profile,
}

USAGE = """usage: explore OPERATOR [options]        explore an operator's memory (see explore OPERATOR --help)
       explore operators                 list operators
       explore profile OPERATOR SHAPE    profile one shape
"""


def _dispatch(argv: list[str]) -> int:
    from explorer.plugins import load_plugins

    load_plugins()
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0 if argv else EXIT_USAGE
    command = COMMANDS.get(argv[0])
    if command is not None:
        return command(argv[1:])
    if "explore" in COMMANDS:
        return COMMANDS["explore"](argv)
    _operator_name_or_fail(argv[0])
    raise CLIError(f"explore: unknown command {argv[0]!r}")


def _operator_name_or_fail(text: str) -> None:
    try:
        _operator_name(text)
    except argparse.ArgumentTypeError as exc:
        raise CLIError(f"explore: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        return _dispatch(argv)
    except CLIError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("explore: interrupted", file=sys.stderr)
        return 130
    except (ValueError, LookupError, OSError, RuntimeError) as exc:
        if os.environ.get("EXPLORER_DEBUG"):
            raise
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        print(f"explore: {str(message).splitlines()[0] if str(message) else type(exc).__name__}", file=sys.stderr)
        return EXIT_FAILURE
    except Exception as exc:  # a bug of ours: still one line, the traceback on request
        if os.environ.get("EXPLORER_DEBUG"):
            raise
        print(f"explore: internal error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
              " (set EXPLORER_DEBUG=1 for the traceback)", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
