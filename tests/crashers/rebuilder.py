# SPDX-License-Identifier: Apache-2.0
"""The child of test_repair.py: runs `rebuild_consume_queues` or `rebuild_index` on a store and
SIGKILLs itself at the Nth file removal, i.e. in the middle of the wipe (or, with --at-create,
at the Nth ConsumeQueue/index file created while the records are dispatched again)."""
import argparse
import os
import signal
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from rocketstore import repair  # noqa: E402
from rocketstore.fs import FileSystem  # noqa: E402


def die_at(method, n):
    original = getattr(FileSystem, method)
    calls = [0]

    def counting(self, path, *args, **kwargs):
        if "commitlog" not in path:
            calls[0] += 1
            if calls[0] >= n:
                os.kill(os.getpid(), signal.SIGKILL)
        return original(self, path, *args, **kwargs)
    setattr(FileSystem, method, counting)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("store")
    ap.add_argument("--tool", choices=["cq", "index"], required=True)
    ap.add_argument("--kill-at", type=int, required=True)
    ap.add_argument("--at-create", action="store_true")
    ap.add_argument("--backend", default=None)
    args = ap.parse_args()
    die_at("create_sized" if args.at_create else "remove", args.kill_at)
    if args.tool == "cq":
        repair.rebuild_consume_queues(args.store, kernels=args.backend)
    else:
        repair.rebuild_index(args.store, kernels=args.backend)
    print("finished")


if __name__ == "__main__":
    main()
