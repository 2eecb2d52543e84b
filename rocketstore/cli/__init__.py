# SPDX-License-Identifier: Apache-2.0
"""The `rocketstore` command. `command` parses the line and runs one subcommand module."""
from .command import build_parser, main
from .common import UsageError, check_counts, require_store_dir
from .stat import store_stat

__all__ = ["build_parser", "check_counts", "main", "require_store_dir", "store_stat",
           "UsageError"]
