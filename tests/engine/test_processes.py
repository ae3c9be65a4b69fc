"""dynasem._engine.processes: a holder's process recorded, and proven dead (or not) from /proc; and
the
takeover of holders proven dead, planted in the table as a holder of this host would be."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from django.conf import settings
from django.core.checks import run_checks
from django.test import override_settings

from dynasem import SemaphoreBusy, semaphore
from dynasem import _clock as clock
from dynasem._engine import processes
from dynasem._storage import dynamodb, lock_rows, lock_writes, records
from tests.support.helpers import PERMITS_ENV, enqueue_entry

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or processes.identity() is None,
    reason="dead holders are recognised on Linux only",
)


@pytest.fixture(autouse=True)
def fresh_identity() -> Iterator[None]:
    """Each test probes this process's identity anew (some change what the probe sees)."""
    processes._forget_after_fork()
    yield
    processes._forget_after_fork()


def _start_time(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rpartition(")")[2].split()[19])


def _host() -> str:
    mine = processes.identity()
    assert mine is not None
    return mine.split(processes.SEP)[0]


def identity_of(pid: int, start: int | None = None) -> str:
    return processes.SEP.join(
        [_host(), str(pid), str(_start_time(pid) if start is None else start)]
    )


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A live process of this host (not ours)."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def dead() -> str:
    """The identity of a process of this host that has ended and been reaped."""
    proc = subprocess.Popen(["sleep", "60"])
    recorded = identity_of(proc.pid)
    proc.kill()
    proc.wait()
    return recorded


# -- the identity and the proof --------------------------------------------------------------


def test_the_identity_is_short_and_names_this_process() -> None:
    recorded = processes.identity()
    assert recorded is not None
    host, pid, start = recorded.split(processes.SEP)
    assert len(host) == 16  # 96 bits
    assert int(pid) == os.getpid()
    assert int(start) == _start_time(os.getpid())
    assert len(recorded.encode()) <= 40
    assert processes.local(recorded) and not processes.gone(recorded)


def test_a_process_is_gone_only_when_proc_proves_it(sleeper: subprocess.Popen[bytes]) -> None:
    alive = identity_of(sleeper.pid)
    start = _start_time(sleeper.pid)
    assert not processes.gone(alive)
    # The pid now names a newer process than the one recorded: that one ended.
    assert processes.gone(identity_of(sleeper.pid, start - 1))
    # A start time earlier than recorded cannot be: not understood, not decided.
    assert not processes.gone(identity_of(sleeper.pid, start + 1))
    sleeper.kill()
    deadline = time.monotonic() + 10
    while open(f"/proc/{sleeper.pid}/stat").read().rpartition(")")[2].split()[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert processes.gone(alive)  # a zombie: killed, not reaped yet
    sleeper.wait()
    assert processes.gone(alive)  # reaped: no /proc/<pid>


def test_a_zombie_first_thread_whose_other_threads_run_is_alive() -> None:
    """The first thread of a process exits while another goes on: /proc shows a zombie under
    the pid, but the process still runs code."""
    code = (
        "import ctypes, threading, time\n"
        "threading.Thread(target=time.sleep, args=(30,)).start()\n"
        "ctypes.CDLL(None).pthread_exit(None)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        recorded = identity_of(proc.pid)
        deadline = time.monotonic() + 10
        while open(f"/proc/{proc.pid}/stat").read().rpartition(")")[2].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.005)
        assert len(os.listdir(f"/proc/{proc.pid}/task")) == 2
        assert not processes.gone(recorded)
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("other", ["boot", "pid-ns", "time-ns"])
def test_a_process_of_another_host_or_namespace_is_never_proven_dead(dead: str, other: str) -> None:
    boot = open("/proc/sys/kernel/random/boot_id").read().strip()
    pid_ns, time_ns = os.readlink("/proc/self/ns/pid"), os.readlink("/proc/self/ns/time")
    assert processes.host_key(boot, pid_ns, time_ns) == _host()
    changed = {
        "boot": (str(uuid.uuid4()), pid_ns, time_ns),
        "pid-ns": (boot, "pid:[4026599999]", time_ns),
        "time-ns": (boot, pid_ns, "time:[4026599999]"),
    }[other]
    _, pid, start = dead.split(processes.SEP)
    forged = processes.SEP.join([processes.host_key(*changed), pid, start])
    assert processes.gone(dead)
    assert not processes.local(forged) and not processes.gone(forged)


@pytest.mark.parametrize("recorded", [None, "", "x", "a.b.c", "AAAA.1.2"])
def test_nothing_or_garbage_is_never_proven_dead(recorded: str | None) -> None:
    assert not processes.gone(recorded)
    garbled = f"{_host()}{processes.SEP}12x{processes.SEP}5"
    assert not processes.gone(garbled)


def test_nothing_is_recorded_where_proc_cannot_be_trusted(monkeypatch: pytest.MonkeyPatch) -> None:
    read = processes._read
    ours_before = identity_of(os.getpid(), 1)  # this process's host, an earlier process

    def reading(replace: dict[str, str]) -> Callable[[str], str]:
        return lambda path: replace.get(path) or read(path)

    # Another pid namespace's /proc: NSpid shows us at two levels.
    status = read("/proc/self/status")
    nested = status.replace("NSpid:\t", "NSpid:\t99999\t")
    monkeypatch.setattr(processes, "_read", reading({"/proc/self/status": nested}))
    processes._forget_after_fork()
    assert processes.identity() is None
    # /proc mounted with hidepid: a missing /proc/<pid> would prove nothing.
    mounts = "22 27 0:21 / /proc rw,relatime - proc proc rw,hidepid=invisible\n"
    monkeypatch.setattr(processes, "_read", reading({"/proc/self/mountinfo": mounts}))
    processes._forget_after_fork()
    assert processes.identity() is None
    assert not processes.gone(ours_before)  # nor is anyone else's end proven
    # Not Linux.
    monkeypatch.setattr(processes, "_read", read)
    monkeypatch.setattr(sys, "platform", "darwin")
    processes._forget_after_fork()
    assert processes.identity() is None


def _in_pid_namespace_without_its_proc(code: str) -> str:
    """Run ``code`` as pid 1 of a new pid namespace (``unshare -Urpf``) that kept the machine's
    ``/proc``: there ``/proc/1`` is the machine's init, another process than ours."""
    if shutil.which("unshare") is None:
        pytest.skip("util-linux's unshare is missing")
    setup = "import django; django.setup()\n"
    run = subprocess.run(
        ["unshare", "-Urpf", sys.executable, "-c", setup + code],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.support.settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    if run.returncode != 0 and "unshare failed" in run.stderr:
        pytest.skip(f"no pid namespace here: {run.stderr.strip()}")
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_a_pid_namespace_that_sees_another_proc_records_nothing() -> None:
    # Our pid is 1 there, and /proc/1 the machine's init: its start time is not ours. Before
    # the fix the probe read /proc/<getpid()> and recorded the stranger's start time, so that
    # when the stranger ended a waiter "proved" this live holder dead.
    said = _in_pid_namespace_without_its_proc(
        "import os\nfrom dynasem._engine import processes\n"
        "print(os.getpid(), os.readlink('/proc/self'), processes.identity())"
    )
    pid, proc_self, recorded = said.split()
    assert pid == "1" and proc_self != pid  # the situation the test is about
    assert recorded == "None"


def test_hidepid_off_is_no_obstacle(monkeypatch: pytest.MonkeyPatch) -> None:
    read = processes._read
    for options in ("rw", "rw,hidepid=0", "rw,hidepid=off,subset=pid"):
        mounts = f"22 27 0:21 / /proc rw,relatime - proc proc {options}\n"
        monkeypatch.setattr(
            processes, "_read", lambda p, m=mounts: m if p == "/proc/self/mountinfo" else read(p)
        )
        processes._forget_after_fork()
        assert processes.identity() is not None, options


# -- taking over holders proven dead ---------------------------------------------------------


def plant(
    resource: str,
    recorded: str | None,
    *,
    mode: str = "x",
    limit: int = 1,
    lease_ms: int = 60_000,
    token: str | None = None,
) -> str:
    """A holder entry as the process ``recorded`` would have written it (lease 60 s)."""
    token = token or uuid.uuid4().hex
    now = clock.now_ms()
    entry = lock_writes.holder_entry(
        "planted", now + lease_ms, clock.new_fence(0.5), now, mode == "s", recorded
    )
    try:
        lock_rows.update(
            lock_writes.take_free(
                resource, token, entry, mode=mode, limit=limit, stale_ms=now - 500
            )
        )
    except dynamodb.Refused:
        seen = lock_rows.get(resource)
        assert seen is not None
        lock_rows.update(
            lock_writes.take_join(
                resource, token, entry, mode=mode, limit=limit, seen=seen, evict=[]
            )
        )
    return token


def holders(resource: str) -> set[str]:
    return set((lock_rows.get(resource) or records.LockItem()).holders)


def test_a_dead_holder_of_this_host_is_evicted_in_the_takers_write(
    requests_sent, dead: str
) -> None:
    gone = plant("dead:1", dead)
    before = lock_rows.get("dead:1")
    assert before is not None
    requests_sent.reset()
    with semaphore("dead:1", wait=0) as held:
        # The blind take is refused with the item; the takeover is the next write.
        assert dict(requests_sent.calls) == {"UpdateItem": 2}
        assert holders("dead:1") == {held.token} and gone not in holders("dead:1")
        assert held.fence > before.fence


@pytest.mark.parametrize(
    ("setting", "environ"),
    [(False, {}), (None, {"AWS_LAMBDA_INITIALIZATION_TYPE": "snap-start"}),
     (None, {"AWS_LAMBDA_FUNCTION_NAME": "api"})],
    ids=["off", "snap-start", "lambda"],
)  # fmt: skip
def test_same_host_takeover_off_waits_for_the_lease(
    lock_table: str,
    dead: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    setting: bool | None,
    environ: dict[str, str],
) -> None:
    # A clone of one memory snapshot shares this boot id, yet its processes are missing from
    # our /proc: proving them dead from here would be wrong. Off, nothing is recorded, no
    # recorded process is proven dead, and a dead holder is taken over at its lease's end.
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    plant("clone:1", dead)
    with override_settings(DYNASEM={**settings.DYNASEM, "SAME_HOST_TAKEOVER": setting}):
        with caplog.at_level(logging.INFO, logger="dynasem"):
            assert processes.identity() is None
        assert not processes.gone(dead) and not processes.local(dead)
        assert "same-host takeover of dead holders is off" in caplog.text
        with pytest.raises(SemaphoreBusy):
            semaphore("clone:1", wait=0).acquire()
        [info] = [m for m in run_checks() if m.id == "dynasem.I001"]
        assert ("snap-start" in info.msg) == ("AWS_LAMBDA_INITIALIZATION_TYPE" in environ)
    # Left at its default, and neither on Lambda nor restored from a snapshot: on again.
    monkeypatch.delenv("AWS_LAMBDA_INITIALIZATION_TYPE", raising=False)
    monkeypatch.delenv("AWS_LAMBDA_FUNCTION_NAME", raising=False)
    assert processes.gone(dead)
    assert not [m for m in run_checks() if m.id == "dynasem.I001"]


def test_a_holder_whose_pid_was_reused_is_taken_over(
    lock_table: str, sleeper: subprocess.Popen[bytes]
) -> None:
    plant("reused:1", identity_of(sleeper.pid, _start_time(sleeper.pid) - 1))
    with semaphore("reused:1", wait=0) as held:
        assert holders("reused:1") == {held.token}


@pytest.mark.parametrize("how", ["alive", "other-boot", "started-later", "none"])
def test_a_holder_not_proven_dead_is_not_taken_over(
    lock_table: str, sleeper: subprocess.Popen[bytes], dead: str, how: str
) -> None:
    recorded = {
        "alive": identity_of(sleeper.pid),
        "other-boot": processes.SEP.join(
            [processes.host_key(str(uuid.uuid4()), "pid:[1]", ""), *dead.split(processes.SEP)[1:]]
        ),
        "started-later": identity_of(sleeper.pid, _start_time(sleeper.pid) + 1),
        "none": None,
    }[how]
    planted = plant(f"kept:{how}", recorded)
    with pytest.raises(SemaphoreBusy):
        semaphore(f"kept:{how}", wait=0.3).acquire()
    assert holders(f"kept:{how}") == {planted}


def test_a_takeover_with_a_shorter_lease_makes_its_own_lease_end_the_rows(
    lock_table: str, dead: str
) -> None:
    plant("short:1", dead, lease_ms=600_000)
    held = semaphore("short:1", lease=5).acquire()
    row = lock_rows.get_item("short:1")
    assert row is not None
    expires_ms = round(held.expires.timestamp() * 1000)
    assert row["expMs"] == expires_ms  # not the dead holder's ten minutes
    assert row["expires"] == records.bucket_of(expires_ms)
    held.release()


# Planted counting holders are inline holders of the row: the layout of a limit of at most
# permit_items.INLINE_MAX. Where permit items start lower (make test-permits), a dead permit
# holder is tested in test_permits.py instead.
inline_counting = pytest.mark.skipif(
    bool(os.environ.get(PERMITS_ENV)),
    reason="plants inline counting holders; with permit items from a lower limit "
    "(DYNASEM_TEST_PERMITS_FROM) test_permits.py covers a dead permit holder",
)


@inline_counting
def test_a_dead_counting_holder_gives_its_slot(
    lock_table: str, sleeper: subprocess.Popen[bytes], dead: str
) -> None:
    live = plant("slots:1", identity_of(sleeper.pid), mode="n", limit=2)
    gone = plant("slots:1", dead, mode="n", limit=2, lease_ms=61_000)
    with semaphore("slots:1", limit=2, wait=0) as held:
        assert holders("slots:1") == {live, held.token} and gone not in holders("slots:1")


@inline_counting
def test_a_counting_holder_with_room_left_costs_no_look_in_proc(
    lock_table: str, sleeper: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert processes.identity() is not None  # probed (its own look in /proc) before counting
    looks: list[int] = []
    stat = processes._stat
    monkeypatch.setattr(processes, "_stat", lambda pid: looks.append(pid) or stat(pid))
    plant("slots:2", identity_of(sleeper.pid), mode="n", limit=3)
    for _ in range(3):
        with semaphore("solo:1"):
            pass
    with semaphore("slots:2", limit=3, wait=0):
        pass
    assert looks == []


def test_dead_readers_give_way_to_a_writer(lock_table: str, dead: str) -> None:
    readers = {plant("doc:1", dead, mode="s"), plant("doc:1", dead, mode="s", lease_ms=61_000)}
    with semaphore("doc:1", wait=0) as held:
        assert holders("doc:1") == {held.token} and not readers & holders("doc:1")


def test_a_dead_holder_of_several_resources_is_taken_over_resource_by_resource(
    lock_table: str, dead: str
) -> None:
    token = uuid.uuid4().hex
    for resource in ("pair:a", "pair:b", "pair:c"):
        plant(resource, dead, token=token)
    with semaphore(["pair:a", "pair:b"], wait=0) as held:  # one transaction
        assert holders("pair:a") == holders("pair:b") == {held.token}
    with semaphore("pair:c", wait=0) as held:
        assert holders("pair:c") == {held.token}


def test_exactly_one_of_many_takers_wins(lock_table: str, dead: str) -> None:
    plant("race:1", dead)
    won, refused = [], []
    start = threading.Barrier(8)

    def take() -> None:
        start.wait()
        try:
            won.append(semaphore("race:1", wait=0).acquire())
        except SemaphoreBusy:
            refused.append(True)

    threads = [threading.Thread(target=take) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert len(won) == 1 and len(refused) == 7
        assert holders("race:1") == {won[0].token}
    finally:
        for held in won:
            held.release()


@pytest.mark.parametrize("meanwhile", ["renewed", "released"])
def test_a_renewal_or_release_racing_with_the_takeover_wins(
    lock_table: str, dead: str, meanwhile: str
) -> None:
    """The takeover names the dead holder's token and lease end: a holder that renewed or gave
    back between our read and our write (it was not dead after all) refuses our write."""
    gone = plant("racing:1", dead)
    seen = lock_rows.get("racing:1")
    assert seen is not None
    if meanwhile == "renewed":
        lock_rows.update(
            lock_writes.renew_hold("racing:1", gone, clock.now_ms() + 90_000, raise_item=True)
        )
    else:
        lock_rows.update(lock_writes.give_back("racing:1", gone, clock.now_ms(), sole=True))
    now = clock.now_ms()
    entry = lock_writes.holder_entry("taker", now + 10_000, clock.new_fence(0.5), now, False)
    takeover = lock_writes.take_join(
        "racing:1", "taker", entry, mode="x", limit=1, seen=seen, evict=[gone], replace=True
    )
    with pytest.raises(dynamodb.Refused):
        lock_rows.update(takeover)


def test_a_hold_handed_to_a_waiter_that_died_is_taken_over(lock_table: str, dead: str) -> None:
    """A hand-over records the heir's process from its queue entry: an heir that died while
    waiting holds the lock after the hand-over, and is taken over like any dead holder."""
    holder = semaphore("heir:1").acquire()
    now = clock.now_ms()
    heir = records.Waiter(
        clock.new_fence(0), now + 60_000, user_id="heir", lease_ms=60_000, proc=dead
    )
    enqueue_entry("heir:1", "dead-heir", heir)
    holder.renew()  # its answer shows the holder the queue
    holder.release()  # to the dead heir, in the release write
    handed = lock_rows.get("heir:1")
    assert handed is not None and list(handed.holders) == ["dead-heir"]
    assert handed.holders["dead-heir"].proc == dead
    with semaphore("heir:1", wait=0) as held:
        assert holders("heir:1") == {held.token}
