# SPDX-License-Identifier: Apache-2.0
"""StoreCheckpoint below the facade: the 4 KiB file's two layouts, what a reader may not do,
the timestamps recovery starts from, and a full disk or a power cut."""
import errno
import struct

import pytest

from rocketstore import testing
from rocketstore.checkpoint import StoreCheckpoint, reset_dispatch_timestamps
from rocketstore.format import CHECKPOINT_FILE_SIZE
from rocketstore.fs import DEFAULT
from rocketstore.workload import make_messages


def _values(cp):
    return (cp.physic_msg_timestamp, cp.logics_msg_timestamp, cp.index_msg_timestamp,
            cp.master_flushed_offset, cp.confirm_phy_offset)


def test_a_missing_checkpoint_is_created_as_4096_zero_bytes(tmp_path):
    path = str(tmp_path / "checkpoint")
    cp = StoreCheckpoint(path, DEFAULT)
    try:
        assert _values(cp) == (0, 0, 0, 0, 0)
        assert (tmp_path / "checkpoint").read_bytes() == bytes(CHECKPOINT_FILE_SIZE)
    finally:
        cp.close()


def test_flush_writes_the_three_4_9_timestamps_big_endian_and_nothing_after(tmp_path):
    path = str(tmp_path / "checkpoint")
    cp = StoreCheckpoint(path, DEFAULT)
    cp.physic_msg_timestamp, cp.logics_msg_timestamp, cp.index_msg_timestamp = 11, 22, 33
    cp.master_flushed_offset, cp.confirm_phy_offset = 44, 55     # 5.x only: not written
    cp.flush()
    cp.close()
    raw = (tmp_path / "checkpoint").read_bytes()
    assert len(raw) == CHECKPOINT_FILE_SIZE
    assert raw[:24] == struct.pack(">qqq", 11, 22, 33)
    assert raw[24:] == bytes(CHECKPOINT_FILE_SIZE - 24)
    again = StoreCheckpoint(path, DEFAULT, read_only=True)
    assert _values(again) == (11, 22, 33, 0, 0)


def test_the_5_x_layout_adds_the_master_flushed_and_confirm_offsets(tmp_path):
    path = str(tmp_path / "checkpoint")
    cp = StoreCheckpoint(path, DEFAULT, layout_v5=True)
    cp.physic_msg_timestamp, cp.logics_msg_timestamp, cp.index_msg_timestamp = 1, 2, 3
    cp.master_flushed_offset, cp.confirm_phy_offset = 4, 5
    cp.flush()
    cp.close()
    assert (tmp_path / "checkpoint").read_bytes()[:40] == struct.pack(">qqqqq", 1, 2, 3, 4, 5)
    assert _values(StoreCheckpoint(path, DEFAULT, read_only=True)) == (1, 2, 3, 4, 5)


def test_a_read_only_checkpoint_creates_and_writes_nothing(tmp_path):
    path = str(tmp_path / "checkpoint")
    cp = StoreCheckpoint(path, DEFAULT, read_only=True)
    cp.physic_msg_timestamp = 99
    cp.flush()
    cp.close()
    assert not (tmp_path / "checkpoint").exists()
    (tmp_path / "checkpoint").write_bytes(struct.pack(">qqq", 5, 6, 7).ljust(4096, b"\0"))
    before = (tmp_path / "checkpoint").read_bytes()
    cp = StoreCheckpoint(path, DEFAULT, read_only=True)
    cp.physic_msg_timestamp = 99
    cp.flush()
    cp.close()
    assert (tmp_path / "checkpoint").read_bytes() == before


def test_a_short_checkpoint_reads_its_missing_values_as_zero(tmp_path):
    (tmp_path / "checkpoint").write_bytes(struct.pack(">qq", 8, 9))
    cp = StoreCheckpoint(str(tmp_path / "checkpoint"), DEFAULT, read_only=True)
    assert _values(cp) == (8, 9, 0, 0, 0)


@pytest.mark.parametrize("physic, logics, index, expected, expected_index", [
    (10_000, 20_000, 30_000, 7_000, 7_000),      # min(physic, logics) - 3 s
    (20_000, 10_000, 5_000, 7_000, 5_000),       # the index may be older still
    (1_000, 50_000, 0, 0, 0),                    # floored at 0
])
def test_min_timestamp_is_the_older_log_time_less_3_s(tmp_path, physic, logics, index,
                                                      expected, expected_index):
    cp = StoreCheckpoint(str(tmp_path / "checkpoint"), DEFAULT, read_only=True)
    cp.physic_msg_timestamp, cp.logics_msg_timestamp, cp.index_msg_timestamp = \
        physic, logics, index
    assert cp.min_timestamp == expected
    assert cp.min_timestamp_index == expected_index


def test_a_full_disk_refuses_the_checkpoint_with_enospc_not_sigbus(tmp_path):
    fs = testing.FaultInjectingFileSystem()
    fs.fail("reserve", errno.ENOSPC, match="checkpoint")
    with pytest.raises(OSError) as info:
        StoreCheckpoint(str(tmp_path / "checkpoint"), fs)
    assert info.value.errno == errno.ENOSPC


def test_a_power_cut_keeps_the_last_flushed_checkpoint(tmp_path):
    path = str(tmp_path / "checkpoint")
    fs = testing.FaultInjectingFileSystem()
    cp = StoreCheckpoint(path, fs)
    cp.physic_msg_timestamp = cp.logics_msg_timestamp = cp.index_msg_timestamp = 100
    cp.flush()
    fs.crash()
    cp.physic_msg_timestamp = cp.logics_msg_timestamp = cp.index_msg_timestamp = 200
    cp.flush()                     # never reaches the disk
    cp.close()
    fs.drop_unsynced()
    assert _values(StoreCheckpoint(path, DEFAULT, read_only=True))[:3] == (100, 100, 100)


def test_resetting_the_dispatch_timestamps_of_a_short_checkpoint_zeroes_what_it_holds(tmp_path):
    # A file cut short inside indexMsgTimestamp: the reset grows it just enough to hold the
    # fields it zeroes, and leaves the index bytes it had unless the index is reset too.
    path = tmp_path / "checkpoint"
    cut = struct.pack(">qqq", 5, 6, 0x0102030405060708)[:20]
    path.write_bytes(cut)
    reset_dispatch_timestamps(DEFAULT, str(path), False)
    assert path.read_bytes() == bytes(16) + cut[16:]
    path.write_bytes(cut)
    reset_dispatch_timestamps(DEFAULT, str(path), True)
    assert path.read_bytes() == bytes(24)


def test_resetting_a_missing_checkpoint_creates_nothing(tmp_path):
    reset_dispatch_timestamps(DEFAULT, str(tmp_path / "checkpoint"), True)
    assert not (tmp_path / "checkpoint").exists()


def test_a_clean_shutdown_leaves_the_last_records_store_time_as_physic_msg_timestamp(
        tmp_path, backend):
    # The async flusher sleeps 60 s between rounds, so only the shutdown's final flush can
    # set the time (the broker's loop would leave whatever its last thorough round saw).
    config = testing.small_config(flush_interval_commit_log=60_000, flush_commit_log_timed=True)
    store = testing.open_store(tmp_path, backend, config)
    try:
        results = [store.put_message(m) for m in make_messages(5)]
        assert all(r.ok for r in results)
        last = results[-1].store_timestamp
    finally:
        store.shutdown()
    cp = StoreCheckpoint(str(tmp_path / "checkpoint"), DEFAULT, read_only=True)
    assert cp.physic_msg_timestamp == last


def test_a_checkpoint_flush_lets_other_threads_run_while_the_disk_syncs(disk_path):
    # The flush services flush the checkpoint each round. An msync through the mapping holds
    # the GIL, and behind a busy disk it waited 61 ms for the inode's buffer and a cache
    # flush while every thread of the process, the putter too, waited for the GIL.
    cp = StoreCheckpoint(str(disk_path / "checkpoint"), DEFAULT)
    try:
        for attempt in range(5):    # a thread woken on a loaded machine may miss a quick sync
            cp.physic_msg_timestamp = 1_800_000_000_000 + attempt
            _, ran = testing.runs_during(cp.flush)
            if ran:
                break
        else:
            pytest.fail("no other thread ran while the checkpoint was synced")
    finally:
        cp.close()
    with open(disk_path / "checkpoint", "rb") as f:
        assert struct.unpack(">q", f.read(8))[0] == 1_800_000_000_000 + attempt
