# SPDX-License-Identifier: Apache-2.0
"""Child process for test_retention's kill test: fill a store, then delete a topic and die
(os._exit, no cleanup, as a SIGKILL) at the KILL_AT-th file-system change the deletion
makes. Exit status 0 when the deletion finished before that change came."""
import os
import sys

from rocketstore import Message, MessageStore, testing
from rocketstore.fs import FileSystem

ROOT, BACKEND, KILL_AT = sys.argv[1], sys.argv[2], int(sys.argv[3])
CHANGES = ("write_bytes", "rename", "remove", "remove_dir_if_empty", "fsync_dir")


class KillFS(FileSystem):
    armed = False
    count = 0


def _killing(name):
    def call(self, *args, **kwargs):
        if self.armed:
            self.count += 1
            if self.count == KILL_AT:
                os._exit(9)
        return getattr(FileSystem, name)(self, *args, **kwargs)
    return call


for _name in CHANGES:
    setattr(KillFS, _name, _killing(_name))

fs = KillFS()
config = testing.small_config(mapped_file_size_commit_log=4096,
                              mapped_file_size_consume_queue=10 * 20)
store = MessageStore(ROOT, config, kernels=BACKEND, fs=fs)
store.load()
store.start()
store.update_topic_config("T", read_queue_nums=2, write_queue_nums=2)
for i in range(30):
    assert store.put_message(Message("T", b"t%d" % i, queue_id=i % 2)).ok
for i in range(5):
    assert store.put_message(Message("Other", b"o%d" % i)).ok
store.commit_offset("g", "T", 0, 3)
store.persist_configs()
testing.wait_flushed(store.commitlog)
fs.armed = True
store.delete_topic("T")
fs.armed = False
os._exit(0)
