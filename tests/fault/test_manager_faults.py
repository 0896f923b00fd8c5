"""Faults on the manager's side: the manager process killed while a run runs, and the database unreachable
when a run is ingested. Nothing completed may be lost, the interrupted run must be recorded (or stored) by the
next manager, and the hosts reset."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import make_url

from orchestrator.engine import marker
from orchestrator.engine.recovery import STALE_REASON
from orchestrator.lab import netns
from orchestrator.storage.db import open_db
from tests.fault.conftest import Background, ns_pids, run_ids, short_plan, wait_for

REPO = Path(__file__).resolve().parents[2]


def tcplab(*args: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator.cli", *args]


def test_manager_killed_mid_run_is_recovered_by_the_next_manager(fault_lab, tmp_path, ledger):
    began = time.monotonic()
    plan = short_plan(tmp_path, "fault-manager-kill", duration="3s", repetitions=2)
    first, second = run_ids(plan)
    before = fault_lab.complete_runs()
    inventory = str(netns.inventory_path(fault_lab.state_dir))
    argv = tcplab("run", str(plan), "--db", fault_lab.db_url, "--inventory", inventory, "--results",
                  str(fault_lab.results))
    log = open(tmp_path / "manager.log", "wb")
    manager = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        # the first run completes; the manager is killed while the second one's flows run
        wait_for("the second run to start", lambda: (m := marker.read(fault_lab.results / second)) is not None
                 and m.phase == marker.RUNNING, 60)
        wait_for("its flows to run", lambda: ns_pids(fault_lab.namespace("server"), "iperf3"), 30)
        manager.send_signal(signal.SIGKILL)
        manager.wait(10)
    finally:
        if manager.poll() is None:
            manager.kill()
            manager.wait()
    complete_at_kill = fault_lab.complete_runs()
    # the first run is stored, or -- its ingest overlapped with the second run (run_many), held still while the
    # second run's flows ran -- on disk with its INGEST marker for the next manager
    first_marker = marker.read(fault_lab.results / first)
    pending_first = first not in complete_at_kill
    assert not pending_first or (first_marker is not None and first_marker.phase == marker.INGEST), first_marker
    assert second not in complete_at_kill
    assert marker.read(fault_lab.results / second).phase == marker.RUNNING   # left behind by the killed manager
    # the next manager (running another plan) finds the stale run: resets every host, records it failed
    restarted = time.monotonic()
    other = short_plan(tmp_path, "fault-manager-next", duration="2s")
    done = subprocess.run([*argv[:4], str(other), *argv[5:]], cwd=REPO, capture_output=True, text=True, timeout=120)
    said = " ".join(done.stderr.split())   # the console wraps lines
    print(done.stdout[-2000:], said[-3000:])
    assert done.returncode == 0, said[-3000:]
    assert f"recovered run {second}: failed ({STALE_REASON}" in said
    if pending_first:
        assert f"recovered run {first}: complete" in said
    assert first in fault_lab.complete_runs() and marker.read(fault_lab.results / first) is None
    row = fault_lab.run_row(second)
    assert row.status == "failed" and row.error.startswith(STALE_REASON), row
    reset = fault_lab.evidence(second, "reset")
    assert {r: d["restored"] for r, d in reset.items()} == {"client": True, "aqm": True, "server": True}, reset
    assert marker.read(fault_lab.results / second) is None
    salvaged = sorted(str(p.relative_to(fault_lab.results / second)) for p in (fault_lab.results / second).glob("*/*"))
    print(f"stale run's artifacts collected by the next manager: {salvaged}")
    assert salvaged   # what the agents still held of the interrupted run is kept with it
    recovered_in = time.monotonic() - restarted
    # and the killed plan, run again, reruns only the stale run
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    said = " ".join(done.stderr.split())
    assert done.returncode == 0 and "1 of 2 runs already complete" in said, said[-3000:]
    after = fault_lab.complete_runs()
    lost = sum(1 for r, fin in complete_at_kill.items() if after.get(r) != fin)
    lost += sum(1 for r, fin in before.items() if after.get(r) != fin)
    assert second in after and marker.read(fault_lab.results / second) is None
    took = time.monotonic() - began
    ledger.fault("manager killed mid-run", survived=lost == 0 and second in after, runs_lost=lost,
                 detail=f"stale run recorded failed, hosts reset by the next manager ({recovered_in:.0f} s), "
                        f"then rerun; test {took:.0f} s")
    print(f"manager kill: completed before {len(complete_at_kill)}, after {len(after)}, lost {lost}; {took:.1f} s")
    assert lost == 0


class TcpProxy:
    """A TCP forwarder to PostgreSQL that can be cut: the listener closed and every live connection dropped,
    as a database host going away does to the manager."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.socks: list[socket.socket] = []
        self.cut_event = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.cut_event.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.cut_event.is_set():
                client.close()
                return
            upstream = socket.create_connection(self.target)
            self.socks += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        self.cut_event.set()
        try:
            self.listener.shutdown(socket.SHUT_RDWR)   # wakes the accept() (close alone would not, on Linux)
        except OSError:
            pass
        self.listener.close()
        for s in self.socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def test_database_unreachable_at_ingest_keeps_the_run_pending_and_ingest_pending_stores_it(
        fault_lab, tmp_path, pg_url, ledger):
    began = time.monotonic()
    plan = short_plan(tmp_path, "fault-db-down", duration="3s", captures=True)
    run_id = run_ids(plan)[0]
    url = make_url(pg_url)
    proxy = TcpProxy((url.host or "127.0.0.1", url.port or 5432))
    proxied = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    results = tmp_path / "results"
    job = Background(lambda: fault_lab.run(plan, db_url=proxied, results=results))
    # the database is not used between the marker's appearance and the ingest: cut it there
    wait_for("the run to start", lambda: (results / run_id / marker.MARKER_FILE).exists(), 60)
    proxy.cut()
    rc, out = job.join(90)
    print(out)
    direct = open_db(pg_url)
    with direct.connect() as conn:
        partial = {t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()
                   for t in ("run", "flow", "host_evidence", "artifact", "packet")}
    assert rc == 1 and f"run {run_id} not stored" in out, out
    assert all(n == 0 for n in partial.values()), partial
    assert (results / run_id / "ingest.json").exists() and marker.read(results / run_id).phase == marker.INGEST
    # later, the database back (here: reached directly), `tcplab ingest --pending` stores the run
    done = subprocess.run(tcplab("ingest", "--pending", "--results", str(results), "--db", pg_url), cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    print(done.stdout, done.stderr)
    assert done.returncode == 0, done.stderr
    with direct.connect() as conn:
        status = conn.execute(text("SELECT status FROM run WHERE run_id = :r"), {"r": run_id}).scalar_one()
        flows = conn.execute(text("SELECT count(*) FROM flow WHERE run_id = :r"), {"r": run_id}).scalar_one()
        packets = conn.execute(text("SELECT count(*) FROM packet")).scalar_one()
    direct.dispose()
    print(f"database cut at ingest: stored nothing ({partial}); ingest --pending: {status}, {flows} flow(s), "
          f"{packets} packets")
    assert status == "complete" and flows == 1 and packets > 1000
    assert marker.read(results / run_id) is None
    took = time.monotonic() - began
    ledger.fault("database unreachable at ingest", survived=True, runs_lost=0,
                 detail=f"run pending on disk, stored by ingest --pending; test {took:.0f} s")
