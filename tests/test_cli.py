# SPDX-License-Identifier: Apache-2.0
"""The `rocketstore` command, driven as a user would (subprocess)."""
import json

from rocketstore import testing


def rocketstore(*args, check=True):
    return testing.run_cli(*args, check=check)


def test_bench_runs_on_a_temp_store_and_reports_every_phase():
    out = rocketstore("bench", "--messages", "3000", "--queries", "3000", "--json")
    report = json.loads(out.stdout)
    assert [p["phase"] for p in report["phases"]] == ["produce", "consume", "query by key",
                                                      "reopen"]
    assert [p["messages"] for p in report["phases"]] == [3000, 3000, 3000, 3000]
    assert report["phases"][0]["msgs_per_s"] > 0


def test_bench_batches_through_put_messages(tmp_path):
    out = rocketstore("bench", "--messages", "2500", "--batch", "1000", "--topics", "3",
                      "--dir", str(tmp_path / "b"))
    assert "produce" in out.stdout and "consume" in out.stdout
    assert (tmp_path / "b" / "commitlog").is_dir()


def test_dump_filters_by_topic_and_limit(broker_store):
    out = rocketstore("dump", str(broker_store), "--topic", "PayTopic", "--limit", "5")
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(rows) == 5 and {r["topic"] for r in rows} == {"PayTopic"}


def test_dump_of_a_missing_directory_is_one_clear_error(tmp_path):
    out = rocketstore("dump", str(tmp_path / "nope"), check=False)
    assert out.returncode != 0
    assert "error" in out.stderr and "Traceback" not in out.stderr


def test_help_lists_the_subcommands():
    out = rocketstore("--help")
    assert "bench" in out.stdout and "dump" in out.stdout
