# SPDX-License-Identifier: Apache-2.0
"""verify, recover, rebuild-cq, rebuild-index, export and dump filters, driven as a user would."""
import json
import os

from rocketstore import MessageStore, testing


def rocketstore(*args, check=False):
    return testing.run_cli(*args, check=check)


tree_digest = testing.tree_digest


def flip(path, offset, mask=0xFF):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ mask]))


def test_verify_passes_a_broker_written_store(broker_store):
    out = rocketstore("verify", str(broker_store), "--json")
    report = json.loads(out.stdout)
    assert out.returncode == 0 and report["ok"]
    assert report["records"] == 1200 and report["units"] == 1200


def test_verify_finds_each_planted_fault(broker_store):
    flip(broker_store / "commitlog" / "00000000000000098304", 500)          # a body byte
    with open(broker_store / "consumequeue" / "PayTopic" / "1" / "00000000000000000000",
              "r+b") as f:
        f.seek(3 * 20 + 8)
        f.write((2457).to_bytes(4, "big"))                                  # a unit's size
    out = rocketstore("verify", str(broker_store), "--json")
    report = json.loads(out.stdout)
    assert out.returncode == 1
    found = {(p["kind"], p["file"], p["offset"]) for p in report["problems"]}
    assert ("commitlog", "commitlog/00000000000000098304", 496) in found
    assert ("consumequeue", "consumequeue/PayTopic/1/00000000000000000000", 60) in found
    assert len(report["problems"]) <= 8    # one flipped byte: a few problems, not a whole file


def test_verify_checks_every_index_entry(broker_store):
    out = rocketstore("verify", str(broker_store), "--json")
    assert json.loads(out.stdout)["indexEntries"] == 2637
    name = sorted(os.listdir(broker_store / "index"))[2]
    with open(broker_store / "index" / name, "r+b") as f:
        f.seek(40 + 64 * 4 + 20 * 7 + 4)               # entry 7's physical offset
        was = int.from_bytes(f.read(8), "big")
        f.seek(-8, os.SEEK_CUR)
        f.write((999999).to_bytes(8, "big"))
    report = json.loads(rocketstore("verify", str(broker_store), "--json").stdout)
    # The bad entry, and the record whose key it held, now found by no entry.
    cl_size = os.path.getsize(broker_store / "commitlog" / "00000000000000000000")
    assert [(p["kind"], p["file"], p["offset"]) for p in report["problems"]] == \
        [("index", f"index/{name}", 40 + 64 * 4 + 20 * 7),
         ("index", f"commitlog/{was // cl_size * cl_size:020d}", was % cl_size)]


def test_recover_dry_run_changes_nothing_and_recover_truncates(broker_store):
    flip(broker_store / "commitlog" / "00000000000000327680", 200)
    before = tree_digest(broker_store)
    out = rocketstore("recover", "--dry-run", "--json", str(broker_store))
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["truncatedBytes"] > 0 and plan["processOffset"] < 335689
    assert tree_digest(broker_store) == before
    out = rocketstore("recover", str(broker_store))
    assert out.returncode == 0, out.stderr
    with MessageStore(broker_store, MessageStore.open_read_only(broker_store).config) as s:
        assert s.get_max_phy_offset() == plan["processOffset"]


def test_rebuild_cq_restores_every_consume_queue(broker_store):
    original = tree_digest(broker_store / "consumequeue")
    flip(broker_store / "consumequeue" / "LogTopic" / "1" / "00000000000000001000", 44)
    os.remove(broker_store / "consumequeue" / "PayTopic" / "2" / "00000000000000002000")
    out = rocketstore("rebuild-cq", str(broker_store))
    assert out.returncode == 0, out.stderr
    assert tree_digest(broker_store / "consumequeue") == original


def test_rebuild_cq_of_a_store_without_queues_takes_the_file_size_asked(broker_store):
    original = tree_digest(broker_store / "consumequeue")
    for d, _, names in os.walk(broker_store / "consumequeue"):
        for name in names:
            os.remove(os.path.join(d, name))
    out = rocketstore("rebuild-cq", str(broker_store), "--cq-file-size", "1000")
    assert out.returncode == 0, out.stderr
    assert tree_digest(broker_store / "consumequeue") == original


def test_a_locked_store_is_not_repaired(tmp_path):
    from rocketstore import testing
    store = testing.open_store(tmp_path / "s", "pure")
    try:
        out = rocketstore("rebuild-cq", str(tmp_path / "s"))
        assert out.returncode == 2 and "locked" in out.stderr
    finally:
        store.shutdown()


def test_export_streams_one_topic_as_json_lines(broker_store):
    out = rocketstore("export", str(broker_store), "--topic", "OrderTopic", check=True)
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(rows) == 400 and {r["topic"] for r in rows} == {"OrderTopic"}
    assert rows[0]["keys"] == "ord-0" and isinstance(rows[0]["properties"], dict)
    csv_out = rocketstore("export", str(broker_store), "--topic", "LogTopic", "--format", "csv",
                          "--limit", "3", check=True)
    assert len(csv_out.stdout.splitlines()) == 4


def test_dump_selects_by_offset_and_time(broker_store):
    out = rocketstore("dump", str(broker_store), "--from", "163", "--to", "506", check=True)
    offsets = [json.loads(line)["commitLogOffset"] for line in out.stdout.splitlines()]
    assert offsets == [163, 326]
    out = rocketstore("dump", str(broker_store), "--from-time", "1796046495563", "--limit", "2",
                      check=True)
    stamps = [json.loads(line)["storeTimestamp"] for line in out.stdout.splitlines()]
    assert len(stamps) == 2 and min(stamps) >= 1796046495563


def test_every_subcommand_explains_itself():
    for cmd in ("bench", "dump", "export", "verify", "recover", "rebuild-cq", "rebuild-index",
                "stat"):
        out = rocketstore(cmd, "--help", check=True)
        assert "usage:" in out.stdout


def overwrite(path, offset, data):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_verify_reports_a_damaged_record_in_the_last_file_as_findings(broker_store):
    overwrite(broker_store / "commitlog" / "00000000000000327680", 1000, b"\xff\xfe")
    out = rocketstore("verify", str(broker_store))
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "commitlog: commitlog/00000000000000327680@897: corrupt record" in out.stdout


def test_verify_reports_records_whose_consume_queue_file_was_deleted(broker_store):
    for name in ("00000000000000001000", "00000000000000002000"):
        os.remove(broker_store / "consumequeue" / "PayTopic" / "1" / name)
    out = rocketstore("verify", str(broker_store), "--json")
    assert out.returncode == 1
    problems = json.loads(out.stdout)["problems"]
    assert [(p["file"], p["offset"]) for p in problems] == [
        ("consumequeue/PayTopic/1/00000000000000001000", 0)]
    assert "units 50..132 of PayTopic-1 missing" in problems[0]["detail"]


def test_verify_reports_a_gap_between_consume_queue_files(broker_store):
    os.remove(broker_store / "consumequeue" / "PayTopic" / "1" / "00000000000000001000")
    out = rocketstore("verify", str(broker_store))
    assert out.returncode == 1
    assert "consumequeue/PayTopic/1/00000000000000002000: segments missing before it" in \
        out.stdout
    assert "units 50..99 of PayTopic-1 missing" in out.stdout


def test_verify_reports_stray_names_among_segments(broker_store):
    (broker_store / "commitlog" / "00000000000000999999").write_bytes(b"")
    (broker_store / "commitlog" / "notes.txt").write_bytes(b"x")
    out = rocketstore("verify", str(broker_store))
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "commitlog: commitlog/00000000000000999999: start offset 999999 is not a " \
           "multiple of the segment size 32768" in out.stdout
    assert "commitlog: commitlog/notes.txt: not a segment (ignored by the store)" in out.stdout


def test_verify_reports_a_deeply_nested_config_file(broker_store):
    deep = '{"offsetTable":' + '{"a":' * 200_000 + "1" + "}" * 200_001
    (broker_store / "config" / "consumerOffset.json").write_text(deep)
    out = rocketstore("verify", str(broker_store))
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "config: config/consumerOffset.json: does not parse: JSON nested too deeply" \
        in out.stdout


def test_verify_refuses_a_directory_that_holds_no_store(broker_store):
    out = rocketstore("verify", str(broker_store.parent))
    assert out.returncode == 2 and out.stdout == ""
    assert "is not a store directory: expected commitlog/ or checkpoint" in out.stderr


def test_dump_reports_a_corrupt_record_and_prints_every_record_after_it(broker_store):
    expected = [json.loads(line)["commitLogOffset"]
                for line in rocketstore("dump", str(broker_store)).stdout.splitlines()]
    overwrite(broker_store / "commitlog" / "00000000000000098304", 0, b"\x7f\xff")   # TOTALSIZE
    out = rocketstore("dump", str(broker_store))
    assert out.returncode == 1 and "Traceback" not in out.stderr
    got = [json.loads(line)["commitLogOffset"] for line in out.stdout.splitlines()]
    assert got == [o for o in expected if o != 98304]
    assert "commitlog/00000000000000098304@0: record runs past the end of its file" in out.stderr
    assert "1199 message(s) written" in out.stderr


def test_dump_from_an_offset_where_no_record_starts_is_an_error(broker_store):
    out = rocketstore("dump", str(broker_store), "--from", "5")
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        "rocketstore dump: error: no record starts at commit-log offset 5"]


def _index_entries(root):
    report = json.loads(rocketstore("verify", str(root), "--json").stdout)
    return report["indexEntries"], report["ok"]


def test_recover_does_what_its_dry_run_says_on_a_clean_broker_store(broker_store):
    plan = json.loads(rocketstore("recover", "--dry-run", "--json", str(broker_store)).stdout)
    out = rocketstore("recover", "--json", str(broker_store))
    assert out.returncode == 0, out.stderr
    done = json.loads(out.stdout)
    assert done["dispatched"] == plan["redispatchRecords"] == 1200
    assert (done["unitsBefore"], done["unitsAfter"]) == (plan["unitsBefore"],
                                                         plan["unitsAfter"]) == (1200, 1200)
    assert (done["indexEntriesBefore"], done["indexEntriesAfter"]) == \
        (plan["indexEntriesBefore"], plan["indexEntriesAfter"]) == (2637, 2637)
    assert _index_entries(broker_store) == (2637, True)


def test_recover_leaves_a_clean_stores_index_files_as_the_broker_wrote_them(broker_store):
    original = tree_digest(broker_store / "index")
    assert rocketstore("recover", str(broker_store)).returncode == 0
    assert tree_digest(broker_store / "index") == original


def test_recover_does_what_its_dry_run_says_on_a_damaged_tail(broker_store):
    overwrite(broker_store / "commitlog" / "00000000000000327680", 1000, b"\xff\xfe")
    plan = json.loads(rocketstore("recover", "--dry-run", "--json", str(broker_store)).stdout)
    done = json.loads(rocketstore("recover", "--json", str(broker_store)).stdout)
    assert done["processOffset"] == plan["processOffset"] == 328577
    assert done["dispatched"] == plan["redispatchRecords"]
    assert (done["unitsAfter"], done["indexEntriesAfter"]) == \
        (plan["unitsAfter"], plan["indexEntriesAfter"])
    assert plan["unitsBefore"] == 1200 and plan["unitsAfter"] < 1200
    assert _index_entries(broker_store) == (plan["indexEntriesAfter"], True)


def test_recover_does_what_its_dry_run_says_when_it_truncates_inside_indexed_records(
        broker_store):
    # A bad magic in the middle file: recovery cuts the CommitLog there, and so destroys the
    # index files holding entries past the cut and indexes again from the survivors' end.
    overwrite(broker_store / "commitlog" / "00000000000000131072", 4, bytes(4))
    plan = json.loads(rocketstore("recover", "--dry-run", "--json", str(broker_store)).stdout)
    done = json.loads(rocketstore("recover", "--json", str(broker_store)).stdout)
    assert done["processOffset"] == plan["processOffset"] == 131072
    assert (done["unitsAfter"], done["indexEntriesAfter"]) == \
        (plan["unitsAfter"], plan["indexEntriesAfter"])
    assert _index_entries(broker_store) == (plan["indexEntriesAfter"], True)
    assert len(plan["indexFilesRebuilt"]) > 1


def test_verify_of_a_store_in_use_warns_and_checks_what_is_written(tmp_path):
    # No index: a half-empty index file's geometry is ambiguous to a reader (index work).
    store = testing.open_store(tmp_path / "s", "pure",
                               testing.small_config(message_index_enable=False))
    try:
        from rocketstore import Message
        for i in range(50):
            store.put_message(Message("T", b"x" * 100, keys=f"k{i}"))
        testing.wait_dispatched(store)
        out = rocketstore("verify", str(tmp_path / "s"))
    finally:
        store.shutdown()
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"in use (pid {os.getpid()} holds its lock)" in out.stderr
    assert "Traceback" not in out.stderr and "50 records" in out.stdout


def test_verify_reports_index_entries_left_past_a_tail_a_normal_open_truncated(broker_store):
    overwrite(broker_store / "commitlog" / "00000000000000327680", 1000, b"\xff\xfe")
    cfg = MessageStore.open_read_only(broker_store).config
    with MessageStore(broker_store, cfg):
        pass                                  # normal recovery truncates at 328577
    report = json.loads(rocketstore("verify", str(broker_store), "--json").stdout)
    assert report["records"] == 1175 and not report["ok"]
    dangling = [p for p in report["problems"] if p["kind"] == "index"]
    assert dangling and all("where no valid record starts" in p["detail"] for p in dangling)
    assert {p["file"] for p in dangling} == {"index/20261130134815693"}


def test_dump_and_export_limit_zero_print_nothing_and_a_negative_limit_is_refused(broker_store):
    for command in ("dump", "export"):
        out = rocketstore(command, "--limit", "0", str(broker_store))
        assert (out.returncode, out.stdout) == (0, ""), out.stderr
        out = rocketstore(command, "--limit", "2", str(broker_store))
        assert len(out.stdout.splitlines()) == 2
        out = rocketstore(command, "--limit", "-1", str(broker_store))
        assert out.returncode == 2 and out.stdout == ""
        assert out.stderr.splitlines() == [
            f"rocketstore {command}: error: --limit is -1; it must be at least 0"]


def test_one_truncated_index_file_is_named_and_the_others_still_answer(broker_store):
    names = sorted(os.listdir(broker_store / "index"))
    with open(broker_store / "index" / names[0], "r+b") as f:
        f.truncate(100)
    report = json.loads(rocketstore("verify", "--json", str(broker_store)).stdout)
    assert {p["file"] for p in report["problems"]} == {f"index/{names[0]}"}
    assert report["indexEntries"] > 2000           # the other files are checked
    # A key of the last message is indexed in the last file: still found.
    out = rocketstore("query", "key", str(broker_store), "LogTopic", "ord-1199")
    assert out.returncode == 0 and "ord-1199" in out.stdout, out.stderr
    out = rocketstore("recover", str(broker_store))
    assert out.returncode == 1
    assert out.stderr.splitlines()[-1] == (
        f"rocketstore recover: error: {broker_store / 'index'}: index file(s) {names[0]} "
        f"(100 bytes) are not the 10296 bytes of the others: damaged; `rocketstore "
        f"rebuild-index` rebuilds the index")
    assert rocketstore("rebuild-index", str(broker_store)).returncode == 0
    assert json.loads(rocketstore("verify", "--json", str(broker_store)).stdout)["ok"]


def test_a_truncated_first_segment_does_not_set_the_file_size_the_tools_read_with(
        broker_store):
    # The size of most segments is the store's: a short first one used to make every other
    # file "not a segment", hiding the records in them (or failing the tool outright).
    with open(broker_store / "commitlog" / "00000000000000000000", "r+b") as f:
        f.truncate(16000)
    with open(broker_store / "consumequeue" / "LogTopic" / "0" / "00000000000000000000",
              "r+b") as f:
        f.truncate(300)
    out = rocketstore("verify", "--json", str(broker_store))
    report = json.loads(out.stdout)
    assert out.returncode == 1 and report["units"] == 1200, out.stderr
    assert report["records"] > 1100                # only the first file's tail is lost
    problems = {(p["file"], p["detail"]) for p in report["problems"]}
    assert ("commitlog/00000000000000000000", "16000 bytes, segments here are 32768") in problems
    assert ("consumequeue/LogTopic/0/00000000000000000000",
            "300 bytes, segments here are 1000") in problems


def test_stray_files_where_queue_directories_belong_are_reported_not_listed(broker_store):
    (broker_store / "consumequeue" / "Aardvark").write_bytes(b"x")      # sorts first
    (broker_store / "consumequeue" / "LogTopic" / "2").write_bytes(b"x")
    out = rocketstore("verify", str(broker_store))
    assert out.returncode == 1, out.stderr
    assert out.stdout.splitlines()[:2] == [
        "consumequeue: consumequeue/Aardvark: not a topic directory",
        "consumequeue: consumequeue/LogTopic/2: not a queue directory (ignored by the store)"]


def test_an_index_header_with_an_impossible_count_does_not_hide_the_other_index_files(
        broker_store):
    name = sorted(os.listdir(broker_store / "index"))[0]
    overwrite(broker_store / "index" / name, 36, (43142178).to_bytes(4, "big"))  # indexCount
    out = rocketstore("query", "key", str(broker_store), "LogTopic", "ord-1199")
    assert out.returncode == 0 and "ord-1199" in out.stdout, out.stderr
    out = rocketstore("verify", str(broker_store))
    assert out.returncode == 1
    assert out.stdout.splitlines()[0] == \
        f"index: index/{name}@36: indexCount 43142178 outside 1..500"


def test_a_segment_longer_than_the_others_is_one_finding_not_an_unreadable_store(
        broker_store):
    for path, size in ((broker_store / "commitlog" / "00000000000000131072", 65536),
                       (broker_store / "consumequeue" / "PayTopic" / "1" /
                        "00000000000000000000", 2000)):
        with open(path, "r+b") as f:
            f.truncate(size)
    report = json.loads(rocketstore("verify", "--json", str(broker_store)).stdout)
    assert [(p["file"], p["detail"]) for p in report["problems"]] == [
        ("commitlog/00000000000000131072", "65536 bytes, segments here are 32768"),
        ("consumequeue/PayTopic/1/00000000000000000000", "2000 bytes, segments here are 1000")]
    assert (report["records"], report["units"]) == (1200, 1200)
    assert len(rocketstore("dump", str(broker_store)).stdout.splitlines()) == 1200
    out = rocketstore("recover", str(broker_store))       # a writer still refuses it
    assert out.returncode == 1 and "65536 bytes but segments here are 32768" in out.stderr


def test_the_index_numbers_are_told_by_another_full_file_when_the_fullest_is_damaged(
        broker_store):
    names = sorted(os.listdir(broker_store / "index"))
    overwrite(broker_store / "index" / names[4], 40, b"\x7f" * 64 * 4)   # its slot table
    out = rocketstore("query", "key", str(broker_store), "LogTopic", "ord-1199")
    assert out.returncode == 0 and "ord-1199" in out.stdout, out.stderr
    report = json.loads(rocketstore("verify", "--json", str(broker_store)).stdout)
    assert {p["file"] for p in report["problems"] if p["kind"] == "index"} >= \
        {f"index/{names[4]}"}
    assert not any("cannot be told" in p["detail"] for p in report["problems"])
