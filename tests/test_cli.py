# SPDX-License-Identifier: Apache-2.0
"""The `rocketstore` command, driven as a user would (subprocess)."""
import json
import subprocess
import sys

import pytest

from rocketstore import testing


def rocketstore(*args, check=True):
    return testing.run_cli(*args, check=check)


def test_bench_runs_on_a_temp_store_and_reports_every_phase():
    out = rocketstore("bench", "--messages", "3000", "--queries", "3000", "--json")
    report = json.loads(out.stdout)
    assert [p["phase"] for p in report["phases"]] == ["produce", "consume", "query by key",
                                                      "reopen"]
    assert [p["messages"] for p in report["phases"]] == [3000, 3000, 3000, 3000]
    assert report["phases"][0]["msgsPerS"] > 0 and report["bodySize"] == 128
    assert all("_" not in key for phase in report["phases"] for key in phase)


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


def test_help_names_a_default_only_where_there_is_one():
    from rocketstore.cli.command import build_parser
    parser = build_parser()
    sub = next(a for a in parser._actions if a.choices and "bench" in a.choices).choices
    for name in ("bench", "dump", "export", "serve"):
        text = sub[name].format_help()
        # An unset option's None, a flag's False, and a default said twice are noise.
        assert "(default: None)" not in text and "(default: False)" not in text, name
        assert "(default: a temporary one)\n" in text or name != "bench"
    assert "(default: 200000)" in sub["bench"].format_help()
    assert "(default: 10912)" in sub["serve"].format_help()


def test_version_is_printed():
    from rocketstore import __version__
    assert rocketstore("--version").stdout.strip() == f"rocketstore {__version__}"


def test_debug_and_backend_are_accepted_after_the_subcommand(tmp_path):
    out = rocketstore("bench", "--messages", "200", "--queries", "10", "--json",
                      "--backend", "pure", "--debug", "--dir", str(tmp_path / "b"))
    assert json.loads(out.stdout)["backend"] == "pure"
    out = rocketstore("stat", str(tmp_path / "nope"), "--debug", check=False)
    assert out.returncode != 0 and "Traceback" in out.stderr and "no such directory" in out.stderr


def test_an_unexpected_failure_is_one_line_without_debug(tmp_path):
    (tmp_path / "commitlog").mkdir()
    (tmp_path / "checkpoint").mkdir()           # the tools read a file there
    out = rocketstore("dump", str(tmp_path), check=False)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert out.stderr.startswith("rocketstore dump: error: ")


def interrupt(proc, what):
    """Ctrl-C to a command under test, and its output; a command that does not stop within
    120 s is killed (it must not outlive the test) and fails it."""
    import signal
    import subprocess
    proc.send_signal(signal.SIGINT)
    try:
        return proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"{what} did not stop on SIGINT within 120 s: {err}") from None


def test_ctrl_c_ends_a_command_with_one_line_and_status_130(tmp_path):
    import subprocess
    import sys
    proc = subprocess.Popen([sys.executable, "-m", "rocketstore", "bench", "--backend", "pure",
                             "--messages", "50000000", "--dir", str(tmp_path / "b")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stderr.readline()       # the command is under way
    finally:
        out, err = interrupt(proc, "bench")
    assert first.startswith("rocketstore bench: building"), first + err
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "rocketstore bench: interrupted"
    assert "Traceback" not in err


def test_serve_on_a_fresh_store_does_not_log_missing_config_files(tmp_path):
    import subprocess
    import sys
    proc = subprocess.Popen([sys.executable, "-m", "rocketstore", "serve", str(tmp_path / "s"),
                             "--listen", "0", "--status-interval", "0",
                             "--file-size", str(1 << 20)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
    finally:
        out, err = interrupt(proc, "serve")
    assert first.startswith("listening"), err
    assert proc.returncode == 0 and "missing or empty" not in err and "Traceback" not in err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="tgkill and /proc/PID/task")
def test_serve_stops_on_a_sigint_that_one_of_its_other_threads_receives(tmp_path):
    # CPython handles a signal in the main thread; a wait there without a timeout ends early
    # only when the kernel hands the signal to the main thread itself. Sent to one of the
    # store's threads instead, Ctrl-C went unnoticed until the wait timed out (never).
    import os

    def other_thread(proc):
        assert proc.stdout.readline().startswith("listening")
        return next(int(t) for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid)
    proc, out, err = _sigint_to_thread([sys.executable, "-m", "rocketstore", "serve",
                                        str(tmp_path / "s"), "--listen", "0",
                                        "--status-interval", "0", "--file-size", str(1 << 20)],
                                       other_thread)
    assert proc.returncode == 0 and "stopped" in out and "Traceback" not in err, err


def _sigint_to_thread(argv, thread_of):
    """Run `argv`, send SIGINT to the thread `thread_of(proc)` names (it may read the
    process's first lines), and return the process with the rest of its output once it has
    ended (30 s at most; then it is killed and the test fails)."""
    import ctypes
    import signal
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        tid = thread_of(proc)
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.tgkill(proc.pid, tid, signal.SIGINT) == 0, ctypes.get_errno()
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc, out, err


# A store whose puts take 50 ms each: two producers of 100 000 messages in batches of 10
# would put for 500 s unless something stops them.
_SLOW_PRODUCE = """
import threading, time
from rocketstore.cli.bench import _produce
from rocketstore.cli.progress import _Silent

class SlowStore:
    def __init__(self):
        self.lock = threading.Lock()
        self.puts = 0

    def put_messages(self, part):
        with self.lock:
            self.puts += 1
            if self.puts == 1:
                print(threading.get_native_id(), flush=True)
        time.sleep(0.05)
        return [None] * len(part)

store = SlowStore()
try:
    _produce(store, list(range(200_000)), 10, 2, _Silent())
except KeyboardInterrupt:
    puts = store.puts
    time.sleep(0.3)
    print("interrupted", puts, store.puts, flush=True)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="tgkill")
def test_bench_with_producer_threads_stops_them_on_a_sigint_one_of_them_receives():
    # The main thread, joining the producers, runs the handler; handed to a producer, Ctrl-C
    # once waited for every put to end. The producers stop too: the store is shut down next.
    proc, out, err = _sigint_to_thread([sys.executable, "-c", _SLOW_PRODUCE],
                                       lambda proc: int(proc.stdout.readline()))
    assert proc.returncode == 0, err
    word, at_interrupt, later = out.split()
    assert word == "interrupted" and int(at_interrupt) == int(later) < 2_000, out


@pytest.mark.parametrize("args,error", [
    (["--role", "slave"], "--role slave needs --master HOST:PORT"),
    (["--role", "slave", "--master", "nohostport"], "--master is 'nohostport'; it must be "
                                                    "HOST:PORT"),
    (["--produce", "-5"], "--produce is -5; it must be at least 0"),
    (["--batch", "0"], "--batch is 0; it must be at least 1"),
    (["--body-size", "-1"], "--body-size is -1; it must be at least 0"),
    (["--file-size", "0"], "mapped_file_size_commit_log (mappedFileSizeCommitLog) must be > 0, "
                           "got 0"),
    (["--listen", "-1"], "ha_listen_port (haListenPort) must be a port (0..65535), got -1"),
])
def test_serve_refuses_an_unusable_option_with_one_line_and_creates_nothing(tmp_path, args,
                                                                           error):
    # A timeout: an option taken as usable would serve until killed.
    out = subprocess.run([sys.executable, "-m", "rocketstore", "serve", str(tmp_path / "s"),
                          "--listen", "0", *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.splitlines() == [f"rocketstore serve: error: {error}"]
    assert not (tmp_path / "s").exists()
