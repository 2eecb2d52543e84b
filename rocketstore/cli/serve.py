# SPDX-License-Identifier: Apache-2.0
"""`rocketstore serve`: run one store with its HA service in the foreground, so two terminals
can show replication:

    rocketstore serve /tmp/m --role master --listen 10912 --produce 100000
    rocketstore serve /tmp/s --role slave --master 127.0.0.1:10912

SIGINT (Ctrl-C) or SIGTERM shuts the store down cleanly and exits 0.
"""
import collections
import logging
import signal
import sys
import threading
import time

from ..services.base import ServiceThread
from .common import SIGNAL_POLL_S, DefaultsHelpFormatter

log = logging.getLogger("rocketstore.serve")

ROLES = {"master": "ASYNC_MASTER", "sync-master": "SYNC_MASTER", "slave": "SLAVE"}


def add_parsers(sub):
    """Register the `serve` subcommand on an argparse subparsers object."""
    sv = sub.add_parser("serve", help="run a store and its HA replication in the foreground "
                                      "(Ctrl-C for a clean shutdown)",
                        formatter_class=DefaultsHelpFormatter)
    sv.add_argument("store_dir", help="store root (created if missing)")
    sv.add_argument("--role", choices=sorted(ROLES), default="master",
                    help="master = ASYNC_MASTER, sync-master = SYNC_MASTER, slave = SLAVE")
    sv.add_argument("--listen", type=int, default=10912,
                    help="master: HA port to listen on (0: any free port)")
    sv.add_argument("--bind", default="127.0.0.1",
                    help="master: interface to bind (RocketMQ 4.9 binds all: 0.0.0.0)")
    sv.add_argument("--master", default=None, help="slave: the master's HA HOST:PORT")
    sv.add_argument("--flush", choices=["async", "sync"], default="async",
                    help="CommitLog flush mode")
    sv.add_argument("--file-size", type=int, default=1 << 30,
                    help="CommitLog file size in bytes (master and slave must agree)")
    sv.add_argument("--produce", type=int, default=0,
                    help="master: put this many demo messages after starting")
    sv.add_argument("--body-size", type=int, default=128, help="demo message body size")
    sv.add_argument("--batch", type=int, default=1,
                    help="demo messages per put_messages call (1: put_message)")
    sv.add_argument("--status-interval", type=float, default=5.0,
                    help="seconds between status lines (0: none)")
    sv.set_defaults(func=run_serve)
    return sv


# The least value of each `serve` count (a file size below 1 is the config's to refuse).
_MINIMUM = {"produce": 0, "body_size": 0, "batch": 1, "status_interval": 0}


def _config(args):
    from .common import UsageError, check_counts
    from ..config import BrokerRole, FlushDiskType, StoreConfig
    check_counts(args, _MINIMUM, "body_size")
    role = BrokerRole[ROLES[args.role]]
    if role is BrokerRole.SLAVE and not args.master:
        raise UsageError("--role slave needs --master HOST:PORT")
    if args.master is not None:
        host, _, port = args.master.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(f"--master is {args.master!r}; it must be HOST:PORT")
    return StoreConfig(
        store_path_root_dir=args.store_dir, broker_role=role,
        flush_disk_type=FlushDiskType.SYNC_FLUSH if args.flush == "sync"
        else FlushDiskType.ASYNC_FLUSH,
        mapped_file_size_commit_log=args.file_size, ha_listen_port=args.listen,
        ha_bind_address=args.bind, ha_master_address=args.master, ha_listen=True)


def _status(store):
    ha = store.ha_service
    if store.is_slave:
        client = ha.client
        if client.error is not None:
            return (f"slave: max offset {store.get_max_phy_offset()}, stopped following "
                    f"{client.master_address}: {client.error}")
        return (f"slave: max offset {store.get_max_phy_offset()}, "
                f"{'connected to' if client.connected else 'waiting for'} "
                f"{client.master_address}, dispatch behind {store.dispatch_behind_bytes()}")
    return (f"master: max offset {store.get_max_phy_offset()}, slaves {ha.connection_count}, "
            f"acked by a slave up to {ha.push2slave_max_offset}" +
            (f"; {ha.slave_error}" if ha.slave_error else ""))


class _Producer(ServiceThread):
    """--produce: puts `args.produce` generated messages, a chunk per loop, then stops; the
    store is shut down only after the chunk under way (shutdown() joins)."""

    name = "produce"

    def __init__(self, store, args):
        super().__init__()
        self.store = store
        self.args = args
        self.counts = collections.Counter()
        self.done = 0

    def run_once(self):
        from ..workload import make_messages
        args, store = self.args, self.store
        if self.done >= args.produce:
            self.stop()
            return
        msgs = make_messages(min(max(args.batch, 1000), args.produce - self.done),
                             body_size=args.body_size, start=self.done)
        if args.batch > 1:
            for i in range(0, len(msgs), args.batch):
                r = store.put_messages(msgs[i:i + args.batch])
                self.counts[r.status.name] += r.count
        else:
            for m in msgs:
                self.counts[store.put_message(m).status.name] += 1
        self.done += len(msgs)

    def on_error(self):
        self.stop()                 # a put that raises (the store closing) ends the run

    def on_shutdown(self):
        log.info("produced %d messages: %s", self.done, dict(self.counts))
        print(f"produced {self.done} {dict(self.counts)}", flush=True)


def run_serve(args):
    """Run until SIGINT/SIGTERM; 0 after a clean shutdown."""
    from ..store import MessageStore
    if not args.debug:
        logging.getLogger("rocketstore").setLevel(logging.INFO)
        # A fresh store has no config files yet: "missing, loading .bak" is news only
        # when the .bak then loads, which the config manager says at WARNING.
        logging.getLogger("rocketstore.config_manager").setLevel(logging.WARNING)
    store = MessageStore(args.store_dir, _config(args), kernels=args.backend)
    stop = threading.Event()

    def on_signal(signum, _frame):
        if stop.is_set():
            # A second Ctrl-C, or `timeout` signalling the process group too: interrupting
            # shutdown would leave the store to abnormal recovery.
            log.info("signal %d: already shutting down", signum)
            return
        log.info("signal %d: shutting down", signum)
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    stopped = False
    producer = None
    try:
        store.load()
        store.start()
        if store.is_slave:
            print(f"slave of {args.master}, max offset {store.get_max_phy_offset()}",
                  flush=True)
        else:
            print(f"listening {args.bind}:{store.ha_service.port} role "
                  f"{store.config.broker_role.name}", flush=True)
        if args.produce and not store.is_slave:
            producer = _Producer(store, args)
            producer.start()
        interval = args.status_interval if args.status_interval > 0 else None
        next_status = None if interval is None else time.monotonic() + interval
        # Waited in steps of at most SIGNAL_POLL_S: CPython runs a signal's handler in the
        # main thread only, and a wait without a timeout there is cut short only when the
        # kernel hands the signal to the main thread itself; handed to one of the store's
        # threads, a Ctrl-C went unnoticed (a CI run's `serve` did not stop within 120 s).
        while True:
            step = SIGNAL_POLL_S if next_status is None else min(
                SIGNAL_POLL_S, max(0.0, next_status - time.monotonic()))
            if stop.wait(step):
                break
            if next_status is not None and time.monotonic() >= next_status:
                log.info("%s", _status(store))
                next_status = time.monotonic() + interval
        stopped = True
    finally:
        stop.set()
        try:
            if producer is not None:
                producer.shutdown()
            log.info("%s", _status(store) if store.ha_service is not None else "stopping")
            store.shutdown()
            if stopped:
                print("stopped", flush=True)
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)
    return 0


if __name__ == "__main__":  # pragma: no cover
    from .command import main
    sys.exit(main(["serve"] + sys.argv[1:]))
