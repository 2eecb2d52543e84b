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
    assert plan["truncated_bytes"] > 0 and plan["process_offset"] < 335689
    assert tree_digest(broker_store) == before
    out = rocketstore("recover", str(broker_store))
    assert out.returncode == 0, out.stderr
    with MessageStore(broker_store, MessageStore.open_read_only(broker_store).config) as s:
        assert s.get_max_phy_offset() == plan["process_offset"]


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
