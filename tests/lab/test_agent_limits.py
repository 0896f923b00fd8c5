"""Issue 13, items 4 and 5 against a real agent process: what a stranger on the control network can hold
before hello (connections, time, frames, guesses, log lines), and which session owns the run.

Every case replays a report, bounded: hundreds of connections instead of 20,000, seconds instead of minutes.
The agent runs in a private mount namespace and is killed by pid at the end of each test."""
from __future__ import annotations

import asyncio
import json
import secrets
import statistics
import subprocess
import sys
import time

import pytest
from websockets.asyncio.client import connect, unix_connect
from websockets.exceptions import ConnectionClosed

from orchestrator.agent_client import AgentClient, AgentError, AgentUnreachable
from schemas import handshake, protocol
from tests.support import agent_process
from tests.support.flood import idle_tcp, idle_websockets

CAP = 64   # agents.admission.PreAuthLimits.max_connections


@pytest.fixture
def agent(tmp_path):
    with agent_process.running_agent(tmp_path) as proc:
        yield proc


@pytest.fixture
def netns_agent(tmp_path):
    """An agent in a network namespace of its own (apply/reset touch only its sysctls), on a UNIX socket."""
    with agent_process.running_agent(tmp_path, own_netns=True) as proc:
        yield proc


async def clock_rtts_ms(client: AgentClient, samples: int, pause_s: float = 0.0) -> list[float]:
    rtts = []
    for _ in range(samples):
        t1 = time.time_ns()
        r = await client.clock(t1)
        rtts.append(((time.time_ns() - t1) - (r.t3_ns - r.t2_ns)) / 1e6)
        if pause_s:
            await asyncio.sleep(pause_s)
    return rtts


def figures(rtts: list[float]) -> str:
    ordered = sorted(rtts)
    return (f"median {statistics.median(ordered):.2f} ms, p99 {ordered[int(0.99 * (len(ordered) - 1))]:.2f} ms, "
            f"max {ordered[-1]:.2f} ms over {len(ordered)}")


def test_a_connection_flood_leaves_room_for_the_manager(agent, ledger):
    host, port = "127.0.0.1", int(agent.url.rsplit(":", 1)[1])
    fds_before = agent.fd_count()

    async def go():
        raw = await idle_tcp(host, port, "127.0.0.2", 300)
        for i in range(1, 101):                           # and from 100 addresses: the global cap must hold
            raw += await idle_tcp(host, port, f"127.0.1.{i}", 4)
        ws = await idle_websockets(agent.url, "127.0.0.3", 300, budget_s=30)
        await asyncio.sleep(0.5)
        fds_flooded = agent.fd_count()
        # the manager comes from its own address while a third stranger keeps connecting
        keep_flooding = asyncio.create_task(idle_tcp(host, port, "127.0.0.4", 200))
        client = AgentClient("sv", agent.url, agent.token)
        await client.connect()
        rtts = await clock_rtts_ms(client, 50, pause_s=0.005)
        extra = await keep_flooding
        fds_during = agent.fd_count()
        await client.close()
        for w in raw + extra:
            w.close()
        for c in ws:
            await c.close()
        return len(raw) + len(extra), len(ws), fds_flooded, fds_during, rtts

    n_raw, n_ws, fds_flooded, fds_during, rtts = asyncio.run(go())
    log_bytes = agent.log_path.stat().st_size
    print(f"\nconnection flood: {n_raw} idle TCP + {n_ws} idle WebSocket connections opened; agent fds "
          f"{fds_before} before, {fds_flooded} flooded, {fds_during} with the manager in; manager clock RTT "
          f"{figures(rtts)}; agent log {log_bytes} bytes")
    assert n_raw + n_ws >= 1000
    assert fds_flooded <= fds_before + CAP + 2 and fds_during <= fds_before + CAP + 2
    assert statistics.median(rtts) < 10, figures(rtts)
    assert log_bytes < 64 * 1024
    ledger.fault("connection flood (1,200 idle connections from 103 addresses)", survived=True, runs_lost=0,
                 detail=f"fds {fds_flooded}, clock RTT median {statistics.median(rtts):.2f} ms")


def test_a_silent_connection_is_closed_after_the_hello_timeout(agent, ledger):
    async def go():
        async with connect(agent.url.replace("tcp://", "ws://")) as ws:
            challenge = json.loads(await ws.recv())
            t0 = time.monotonic()
            reply = json.loads(await asyncio.wait_for(ws.recv(), 15))
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 5)
            return challenge, reply, time.monotonic() - t0, closed.value

    challenge, reply, waited, closed = asyncio.run(go())
    print(f"\nhello timeout: closed after {waited:.1f} s with {closed.rcvd.code} {closed.rcvd.reason!r}")
    assert challenge["event"] == "challenge"
    assert reply["error"] == {"code": "unauthenticated", "message": "hello: no hello within 10 s", "field": "hmac"}
    assert 9 < waited < 13 and closed.rcvd.code == 1008 and closed.rcvd.reason == "no hello within 10 s"
    ledger.fault("silent connection after the challenge", survived=True, detail=f"closed after {waited:.1f} s")


async def guess_once(url: str, source: str) -> str:
    """One hello with a wrong token from `source`, as a guesser would send it: the reply's error code."""
    async with connect(url.replace("tcp://", "ws://"), local_addr=(source, 0), open_timeout=2) as ws:
        nonce = json.loads(await ws.recv())["data"]["nonce"]
        mine = secrets.token_hex(32)
        mac = handshake.manager_proof(secrets.token_bytes(32), nonce, mine)
        await ws.send(json.dumps({"id": 1, "op": "hello", "args": {"client": "guesser", "nonce": mine, "hmac": mac}}))
        return json.loads(await ws.recv())["error"]["code"]


def test_token_guessing_is_rate_limited_and_logged_within_a_budget(agent, ledger):
    seconds = 4.0

    async def go():
        codes: dict[str, int] = {}
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            code = await guess_once(agent.url, "127.0.0.5")
            codes[code] = codes.get(code, 0) + 1
        manager = AgentClient("sv", agent.url, agent.token)
        await manager.connect()                       # the real manager, from another address, still gets in
        await manager.close()
        return codes

    codes = asyncio.run(go())
    attempts = sum(codes.values())
    checked = codes.get("unauthenticated", 0)
    refused_lines = agent.log_text().count("hello refused")
    print(f"\ntoken guessing for {seconds:.0f} s: {attempts} attempts ({attempts / seconds:.0f}/s), "
          f"{checked} checked ({checked / seconds:.1f}/s), {codes.get('busy', 0)} refused unchecked; "
          f"{refused_lines} log lines")
    assert set(codes) <= {"unauthenticated", "busy"}
    assert checked <= 5 + seconds * 0.5 + 1 and codes.get("busy", 0) > 0
    assert 1 <= refused_lines <= checked
    ledger.fault("token guessing", survived=True, detail=f"{checked} of {attempts} guesses checked")


def test_large_frames_before_hello_do_not_stall_the_clock(agent, ledger):
    """The report: 4 unauthenticated senders of 8 MiB frames took the manager's clock round trip from 1.8 ms
    to 2 s. Before hello a frame over 64 KiB now closes the connection at its header (1009), unread."""
    client = AgentClient("sv", agent.url, agent.token)

    async def go():
        await client.connect()
        quiet = await clock_rtts_ms(client, 100, pause_s=0.005)
        senders = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.support.flood", "big-frames", "--url", agent.url, "--senders", "4",
            "--seconds", "4", cwd=agent_process.REPO, stdout=subprocess.PIPE)
        await asyncio.sleep(0.5)
        loaded = await clock_rtts_ms(client, 300, pause_s=0.005)
        out, _ = await asyncio.wait_for(senders.communicate(), 60)
        await client.close()
        return quiet, loaded, json.loads(out)

    quiet, loaded, counts = asyncio.run(go())
    print(f"\nclock RTT quiet: {figures(quiet)}\nclock RTT with 4 senders of 8 MiB frames before hello: "
          f"{figures(loaded)}; senders: {counts}")
    assert counts["frames"] > 0 and counts["replies"] == 0          # every big frame ended its connection
    # the senders share this 2-core machine, so the median moves a little; without the limit the tail went
    # to 0.3 s here (2 s on the reporter's host), with it a frame costs the agent a header read
    p99 = sorted(loaded)[int(0.99 * (len(loaded) - 1))]
    assert statistics.median(loaded) < 10 and p99 < 100, figures(loaded)
    ledger.fault("8 MiB frames before hello, 4 senders", survived=True, detail=f"clock RTT {figures(loaded)}")


def test_large_frames_after_hello_are_decoded_off_the_event_loop(agent):
    """An authenticated peer may send 8 MiB frames; they are decoded in a thread. The GIL still serialises
    json.loads, so the clock op pays some of it: the figure is printed, and bounded far below the 2 s reported."""
    async def go():
        clock = AgentClient("sv", agent.url, agent.token)
        await clock.connect()
        others = [AgentClient("sv", agent.url, agent.token) for _ in range(2)]
        for o in others:
            await o.connect()
        big = json.dumps({"id": 99, "op": "status", "args": {"pad": "x" * (8 * 1024 * 1024 - 200)}})
        stop = time.monotonic() + 3

        async def send_big(o: AgentClient) -> int:
            n = 0
            while time.monotonic() < stop:
                await o.ws.send(big)
                await o.ws.recv()
                n += 1
            return n

        senders = asyncio.gather(*(send_big(o) for o in others))
        rtts = await clock_rtts_ms(clock, 200, pause_s=0.01)
        sent = await senders
        for c in [clock, *others]:
            await c.close()
        return rtts, sent

    rtts, sent = asyncio.run(go())
    print(f"\nclock RTT with 2 authenticated senders of 8 MiB frames ({sum(sent)} frames): {figures(rtts)}")
    assert statistics.median(rtts) < 50, figures(rtts)


# ---------------------------------------------------------------- run ownership (item 5)
def _cpu_task(seconds: float) -> protocol.CpuLoadTask:
    now = time.time_ns()
    return protocol.CpuLoadTask(task_id="cpu", start_ns=now, stop_ns=now + int(seconds * 1e9))


def test_a_second_manager_cannot_stop_or_collect_the_first_ones_run(netns_agent, ledger):
    async def go():
        first, second = AgentClient("sv", netns_agent.url, netns_agent.token), \
            AgentClient("sv", netns_agent.url, netns_agent.token)
        await first.connect("manager-a")
        await second.connect("manager-b")
        await first.schedule(protocol.ScheduleArgs(run_id="r1", tasks=[_cpu_task(4)]))
        collecting = asyncio.create_task(first.collect(protocol.CollectArgs(run_id="r1", timeout_s=30),
                                                       netns_agent.tmp / "sink"))
        await asyncio.sleep(0.3)                          # the owner is now waiting inside collect
        refusals = {}
        calls = {"stop": second.stop(), "status": second.status(), "reset": second.reset(),
                 "collect": second.collect(protocol.CollectArgs(run_id="r1", timeout_s=1), netns_agent.tmp / "x"),
                 "schedule": second.schedule(protocol.ScheduleArgs(run_id="r2", tasks=[_cpu_task(1)])),
                 "apply": second.apply(protocol.ApplyArgs(run_id="r2", state={}))}
        for op, call in calls.items():
            t0 = time.monotonic()
            with pytest.raises(AgentError) as err:
                await call
            refusals[op] = (err.value, time.monotonic() - t0)
        assert not collecting.done()                      # the owner's run was not touched
        result = await collecting
        await first.close()
        await second.close()
        return refusals, result

    refusals, result = asyncio.run(go())
    for op, (err, took) in refusals.items():
        assert err.code == "busy" and err.field == "run_id" and err.op == op, err
        assert "owned by session #1 ('manager-a' from unix)" in str(err), err
        assert took < 0.5, f"{op} waited {took:.1f} s"
    assert result.run_id == "r1" and result.tasks[0].state == "done", result.tasks
    print("\nsecond manager refused at once: " + ", ".join(f"{op} {t * 1000:.0f} ms" for op, (_, t) in
                                                         refusals.items()))
    ledger.fault("second manager stops/collects another's run", survived=True, runs_lost=0)


def test_a_manager_killed_mid_collect_can_be_replaced_and_reset_the_host(netns_agent, ledger):
    async def go():
        first = AgentClient("sv", netns_agent.url, netns_agent.token)
        await first.connect("manager-a")
        await first.schedule(protocol.ScheduleArgs(run_id="r1", tasks=[_cpu_task(60)]))
        collecting = asyncio.create_task(first.collect(protocol.CollectArgs(run_id="r1", timeout_s=60),
                                                       netns_agent.tmp / "sink"))
        await asyncio.sleep(0.3)
        first.ws.transport.abort()                        # killed: no bye, no close frame
        with pytest.raises(AgentUnreachable, match="control connection lost"):
            await collecting
        second = AgentClient("sv", netns_agent.url, netns_agent.token)
        await second.connect("manager-b")
        t0 = time.monotonic()
        reset = await second.reset()
        took = time.monotonic() - t0
        status = await second.status()
        await second.close()
        return reset, took, status

    reset, took, status = asyncio.run(go())
    print(f"\nrestarted manager took over and reset in {took:.2f} s (the dead owner's collect waited for 60 s)")
    assert reset.restored and took < 20
    assert all(t.state in ("done", "failed") for t in status.tasks)
    assert "took over from session #1 ('manager-a' from unix)" in netns_agent.log_text()
    ledger.fault("manager killed mid-collect, a new one resets", survived=True, runs_lost=0)


def test_duplicate_task_ids_are_refused_by_the_live_agent(netns_agent):
    async def go():
        client = AgentClient("sv", netns_agent.url, netns_agent.token)
        await client.connect()
        try:
            with pytest.raises(AgentError) as err:
                await client.schedule(protocol.ScheduleArgs(run_id="r1", tasks=[_cpu_task(1), _cpu_task(1)]))
            return err.value
        finally:
            await client.close()

    err = asyncio.run(go())
    assert err.code == "invalid_args" and err.field == "tasks.1.task_id"


def test_the_unix_socket_agent_still_works_without_tls(netns_agent):
    async def go():
        async with unix_connect(netns_agent.url.removeprefix("unix:"), uri="ws://localhost/") as ws:
            return json.loads(await ws.recv())

    assert asyncio.run(go())["data"]["protocol"] == protocol.PROTOCOL_VERSION
