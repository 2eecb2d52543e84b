# SPDX-License-Identifier: Apache-2.0
"""The `rocketstore` command line: `bench` (the main job), `serve`, and offline tools for a
store directory. Each subcommand lives in its own module of this package and registers its
parser there (`add_parsers`); adding one is a module and a line in COMMANDS."""
import argparse
import logging
import sys

from .._version import __version__
from ..errors import (ConfigError, InvalidArgumentError, MessageIllegalError, StoreLockedError,
                      UnsafePathError)
from . import bench, dump, query, repair, serve, stat, topic
from .common import CONFIG_JSON_NOTE, UsageError, require_store_dir

log = logging.getLogger("rocketstore")

# In the order `rocketstore --help` lists them.
COMMANDS = (bench, dump, repair, stat, topic, query, serve)


def build_parser():
    p = argparse.ArgumentParser(
        prog="rocketstore", epilog=CONFIG_JSON_NOTE,
        description="An embeddable Apache RocketMQ message store: benchmark it, or inspect a "
                    "store directory written by rocketstore or by a RocketMQ broker.")
    p.add_argument("--debug", action="store_true",
                   help="show tracebacks and debug logging (accepted anywhere on the line)")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("--backend", default=None, choices=["cext", "cffi", "pure"],
                   help="kernel backend (default: ROCKETSTORE_BACKEND, else the fastest built)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parsers(sub)
    _accept_global_options_anywhere(sub)
    return p


def _accept_global_options_anywhere(sub):
    """`--backend` after the subcommand too (`rocketstore bench --backend pure`, as the README
    writes it). SUPPRESS keeps a subcommand that was not given it from resetting the value
    given before the subcommand."""
    for parser in sub.choices.values():
        nested = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        targets = [parser] + [q for a in nested for q in a.choices.values()]
        for target in targets:
            if any("--backend" in a.option_strings for a in target._actions):
                continue
            target.add_argument("--backend", default=argparse.SUPPRESS,
                                choices=["cext", "cffi", "pure"],
                                help="kernel backend (as before the subcommand)")


def _extract_debug(argv):
    """`--debug` counts wherever it stands on the line, so it never has to be moved in front
    of the subcommand to get a traceback."""
    rest = [a for a in argv if a != "--debug"]
    return len(rest) != len(argv), rest


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    debug, argv = _extract_debug(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    args.debug = debug
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        if getattr(args, "store_dir", None) is not None and args.command in _STORE_COMMANDS:
            require_store_dir(args.store_dir)
        return args.func(args) or 0
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, and keep the interpreter from
        # complaining about the lost stdout at exit.
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"rocketstore {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:             # noqa: BLE001 - one line, never a traceback
        if debug:
            raise
        # 2: the tools refuse to act on what they were given (a bad argument or option
        # value, no store, a store in use, a link they will not write through, a message or
        # config the store refuses); 1: they acted and failed or found problems.
        usage = isinstance(exc, (UsageError, InvalidArgumentError, ConfigError,
                                 StoreLockedError, UnsafePathError, MessageIllegalError))
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"rocketstore {args.command}: error: {text}", file=sys.stderr)
        return 2 if usage else 1


# Commands whose positional argument must be an existing store root (serve and bench may
# create one).
_STORE_COMMANDS = ("dump", "export", "verify", "recover", "rebuild-cq", "rebuild-index",
                   "stat", "query", "delete-topic")
