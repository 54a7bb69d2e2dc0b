"""`flashscale <command>`: each command is a module of this package with `add_parser(sub)` and `run(args)`,
a thin shell over the library. User errors print one line and exit 2; `--debug` shows the traceback."""

from __future__ import annotations

import argparse
import importlib
import sys

from flashscale.errors import UserError

# command name -> module under flashscale.cli (imported lazily: `flashscale --help` stays fast)
COMMANDS = {
    "demo": "demo",
    "train": "train",
    "eval": "eval",
    "generate": "generate",
    "convert": "convert",
    "quantize": "quantize",
}

USER_ERRORS = (UserError, ValueError, TypeError, FileNotFoundError, NotADirectoryError,
               IsADirectoryError, PermissionError, KeyError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flashscale", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show full tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module in COMMANDS.items():
        try:
            mod = importlib.import_module(f"flashscale.cli.{module}")
        except ModuleNotFoundError as e:
            if e.name != f"flashscale.cli.{module}":
                raise
            continue  # command not built yet
        mod.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except USER_ERRORS as e:
        if args.debug:
            raise
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        print(f"flashscale {args.command}: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"flashscale {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
