# SPDX-License-Identifier: Apache-2.0
"""What the subcommands share: the usage error, count checks, the index-geometry options and
the store-root check."""
import argparse
import os

from ..errors import StoreError


class UsageError(StoreError):
    """A command line the tools cannot act on (not a store, a bad argument): exit status 2."""


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Help that names a default only where it tells the reader something: not an option's
    None ("not given") or a flag's False, and not where the help text names its own default."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default is None or action.default is False or "default" in text:
            return text
        return super()._get_help_string(action)


def check_counts(args, minimum, body_size_option):
    """Refuse counts a run cannot use before it builds or opens anything (`minimum`: option
    dest -> least value; `body_size_option`: the dest of a body size, capped at
    max_message_size): they used to end in ZeroDivisionError, a silent empty run, or
    MESSAGE_ILLEGAL from every put."""
    from ..config import StoreConfig
    for name, least in minimum.items():
        value = getattr(args, name)
        if value < least:
            raise UsageError(f"--{name.replace('_', '-')} is {value}; it must be at least {least}")
    cap = StoreConfig().max_message_size
    size = getattr(args, body_size_option)
    if size > cap:
        raise UsageError(f"--{body_size_option.replace('_', '-')} is {size}; a body may be at "
                         f"most {cap} bytes (max_message_size)")


# The longest the main thread of a command waits before it looks for a signal to handle:
# CPython runs a handler only in the main thread, and an untimed wait there wakes for
# Ctrl-C only when the kernel happens to hand the signal to that thread.
SIGNAL_POLL_S = 0.5

# Where a user reaches for json.load: the config files stay byte for byte as a broker writes
# them, so a broker can read a store we wrote.
CONFIG_JSON_NOTE = (
    "config/*.json are written byte for byte as a RocketMQ 4.9 broker writes them: fastjson's "
    "dialect, where consumerOffset.json has bare integer keys ({0:1,1:5}) that json.load "
    "rejects. `rocketstore stat --json` prints the same topics, groups and offsets as "
    "standard JSON.")


def index_options():
    """A parent parser for the commands that open index files: their geometry, which the files
    do not record."""
    index_opts = argparse.ArgumentParser(add_help=False)
    index_opts.add_argument("--max-hash-slot-num", type=int, default=None,
                            help="hash slots per index file (default: inferred from the "
                                 "files, trying 5000000 first)")
    index_opts.add_argument("--max-index-num", type=int, default=None,
                            help="entries per index file (default: inferred, trying 20000000)")
    return index_opts


def print_json(obj, indent=2):
    import json
    import sys
    json.dump(obj, sys.stdout, indent=indent)
    sys.stdout.write("\n")


# What a directory must hold to count as a store root: RocketMQ's store root keeps
# commitlog/, consumequeue/, index/, checkpoint, config/, abort and lock side by side, and
# a broker store always has its CommitLog directory or its checkpoint.
STORE_MARKERS = ("commitlog", "checkpoint")


def require_store_dir(path):
    """Refuse a path that is no store root, saying what a store root holds; the tools would
    otherwise read any directory as an empty store and answer OK."""
    if not os.path.exists(path):
        raise UsageError(f"{path}: no such directory")
    if not os.path.isdir(path):
        raise UsageError(f"{path} is not a directory")
    present = [m for m in STORE_MARKERS if os.path.exists(os.path.join(path, m))]
    if not present:
        raise UsageError(f"{path} is not a store directory: expected commitlog/ or checkpoint "
                         f"in it (a store root holds commitlog/, consumequeue/, index/, "
                         f"checkpoint, config/)")
    cl = os.path.join(path, "commitlog")
    if os.path.lexists(cl) and not os.path.isdir(cl):
        raise UsageError(f"{cl} is not a directory")
    return path
