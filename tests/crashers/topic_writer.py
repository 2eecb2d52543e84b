# SPDX-License-Identifier: Apache-2.0
"""A child of test_fs_hygiene.py: threads update topics.json until the process is killed, and
print `ack <topic>` once each update_topic_config has returned (the update is acknowledged)."""
import os
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from rocketstore import MessageStore  # noqa: E402
from rocketstore.testing import small_config  # noqa: E402

THREADS = 6


def main():
    root = sys.argv[1]
    round_ = sys.argv[2]
    store = MessageStore(root, small_config())
    store.load()
    out = threading.Lock()

    def hammer(t):
        i = 0
        try:
            while True:
                name = f"R{round_}_T{t}_{i}"
                store.update_topic_config(name, write_queue_nums=1 + i % 8)
                with out:
                    os.write(1, f"ack {name}\n".encode())
                i += 1
        except BaseException as exc:        # a failed update ends the run, visibly
            os.write(2, f"{type(exc).__name__}: {exc}\n".encode())
            os._exit(3)

    os.write(1, b"ready\n")
    for t in range(THREADS):
        threading.Thread(target=hammer, args=(t,), daemon=True).start()
    threading.Event().wait()


if __name__ == "__main__":
    main()
