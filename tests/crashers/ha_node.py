# SPDX-License-Identifier: Apache-2.0
"""The child test_ha.py drives: one store (master or slave) with its HA service.

Prints `port <n>` (master) and `ready`, then with --produce N (or -1: until killed) puts
messages from crashers.writer.message and prints `ack <index> <offset> <size> <status>` per
message and `done <max offset>` at the end. It then waits for stdin to close or SIGTERM and
shuts the store down cleanly (`stopped`).
"""
import argparse
import os
import signal
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.dirname(HERE))

from rocketstore import MessageStore  # noqa: E402
from rocketstore.config import BrokerRole, FlushDiskType  # noqa: E402
from rocketstore.testing import small_config  # noqa: E402

from crashers.writer import message  # noqa: E402


def node_config(role, file_size=64 * 1024, master=None, heartbeat=200, housekeeping=3000,
                slave_timeout=3000, flush="async", batch=32 * 1024):
    """The config every HA test store uses (child and parent must agree on file size)."""
    return small_config(
        broker_role=BrokerRole[role], mapped_file_size_commit_log=file_size, ha_listen_port=0,
        ha_listen=True,
        ha_master_address=master, ha_send_heartbeat_interval=heartbeat,
        ha_housekeeping_interval=housekeeping, slave_timeout=slave_timeout,
        ha_transfer_batch_size=batch,
        flush_disk_type=FlushDiskType.SYNC_FLUSH if flush == "sync" else
        FlushDiskType.ASYNC_FLUSH)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("store")
    ap.add_argument("--role", choices=[r.name for r in BrokerRole], required=True)
    ap.add_argument("--master", default=None)
    ap.add_argument("--backend", default=None)
    ap.add_argument("--file-size", type=int, default=64 * 1024)
    ap.add_argument("--produce", type=int, default=0)
    ap.add_argument("--batch-every", type=int, default=0,
                    help="every Nth put is a put_messages of 2..20 messages")
    ap.add_argument("--wait-slave", action="store_true",
                    help="produce only once a slave has reported its offset")
    # The tests' 3 s is shorter than the 5 s a 4.9.8 peer waits before its first report or
    # heartbeat: following a Java peer (README, "Replication with a Java peer") takes 20000,
    # the default of both stores.
    ap.add_argument("--housekeeping", type=int, default=3000,
                    help="ha_housekeeping_interval in ms (default: the tests' 3000)")
    args = ap.parse_args()
    store = MessageStore(args.store, node_config(args.role, args.file_size, args.master,
                                                 housekeeping=args.housekeeping),
                         kernels=args.backend)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    store.load()
    store.start()
    out = sys.stdout
    if store.ha_service.port is not None:
        out.write(f"port {store.ha_service.port}\n")
    out.write("ready\n")
    out.flush()
    if args.wait_slave:
        # Until the writer has picked its start: a brand-new slave starts at the last file
        # the master has at that moment (doc/05 §3.3).
        while not (stop.is_set() or any(c.next_transfer_from_where >= 0
                                        for c in store.ha_service.connections)):
            time.sleep(0.005)
    i = 0
    while (args.produce < 0 or i < args.produce) and not stop.is_set():
        if args.batch_every and i % args.batch_every == 0:
            n = 2 + i % 19
            rs = store.put_messages([message(j) for j in range(i, i + n)])
            out.write("".join(f"ack {i + k} {int(o)} {int(s)} {rs.status.name}\n"
                              for k, (o, s) in enumerate(zip(rs.commit_log_offsets, rs.sizes))))
            i += n
        else:
            r = store.put_message(message(i))
            out.write(f"ack {i} {r.commit_log_offset} {r.wrote_bytes} {r.status.name}\n")
            i += 1
        out.flush()
    out.write(f"done {store.get_max_phy_offset()}\n")
    out.flush()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    stop.wait()
    store.shutdown()
    out.write("stopped\n")
    out.flush()


if __name__ == "__main__":
    main()
