# SPDX-License-Identifier: Apache-2.0
"""CommitLog methods recovery and replication change the log through (doc/03 §5, doc/05 §4),
on a CommitLog of its own, without a MessageStore."""
import pytest

from rocketstore import testing
from rocketstore.commitlog import CommitLog
from rocketstore.config import BrokerRole
from rocketstore.fs import FileSystem

FILE = 64 * 1024


@pytest.fixture
def commitlog(tmp_path, backend):
    config = testing.small_config(broker_role=BrokerRole.SLAVE, mapped_file_size_commit_log=FILE)
    log = CommitLog(str(tmp_path), config, backend, FileSystem())
    log.load()
    yield log
    log.stop_puts()
    log.close()


def test_truncate_to_drops_later_files_zeroes_the_tail_and_moves_every_position(commitlog):
    data = bytes(range(1, 256)) * 256                  # no zero byte: the tail is visible
    for start in range(0, 2 * FILE + 1024, 1024):
        assert commitlog.append_data(start, data[:1024])
    assert len(commitlog.mfq.files) == 3
    cut = FILE + 300
    commitlog.truncate_to(cut)
    mfq = commitlog.mfq
    assert commitlog.max_offset == cut
    assert mfq.flushed_where == mfq.committed_where == cut
    assert [f.file_from_offset for f in mfq.files] == [0, FILE]
    last = mfq.files[-1]
    assert last.wrote_position == last.committed_position == last.flushed_position == 300
    assert bytes(last.mm[300:1000]) == bytes(700)      # the dropped tail reads as zeros
    assert bytes(commitlog.get_data(FILE, 300)) == bytes(data[:300])
    assert commitlog.append_data(cut, b"next")         # appends go on where it was cut


def test_reset_queue_offsets_takes_a_copy_the_next_put_numbers_from(commitlog):
    table = {("T", 0): 7, ("T", 1): 0}
    commitlog.reset_queue_offsets(table)
    table[("T", 0)] = 99                               # the caller's dict is not shared
    assert commitlog.topic_queue_table == {("T", 0): 7, ("T", 1): 0}
