"""``python -m dart.train ARGS`` is ``dart train ARGS`` (for launchers: ``torchrun -m dart.train CONFIG``)."""

from __future__ import annotations

import argparse
import sys

from dart.config import setup_logging
from dart.errors import DartError
from dart.train.cli import register


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dart.train")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command")
    register(sub)
    args = parser.parse_args(["train", *(sys.argv[1:] if argv is None else argv)])
    setup_logging(args.verbose)
    try:
        return int(args.func(args) or 0)
    except DartError as exc:
        print(f"dart train: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
