"""The app-limited (thin-stream) flow's tasks: the writer on the sender, the sink on the receiver; and the bulk
sender of `bulk` flows (their receivers are the same sinks).

Each is one child process, `python -m agents.appwriter` (agents/appwriter.py) or `python -m agents.bulksend`
(agents/bulksend.py), started with the agent's
own interpreter and package path, tied to the agent's life (agents/children.py) and stopped by pid. The
child writes its log itself (the artifact); its stderr says why it failed.
"""
from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

from agents.bulksend import DRAIN_NS, flow_arg
from agents.children import spawn
from agents.taskbase import TaskRunner
from schemas import limits, procs

PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)   # holds agents/: the child imports agents.appwriter
# -S: no site module (the child needs the standard library only; site-packages' .pth hooks cost startup time)
CHILD = [sys.executable, "-S", "-m", "agents.appwriter"]
BULK_CHILD = [sys.executable, "-S", "-m", "agents.bulksend"]
EXIT_GRACE_S = 30.0   # after its last write the writer only closes; the sink only waits for EOF


def writer_argv(spec, out: Path) -> list[str]:
    """argv of the writer child (pure)."""
    argv = [*CHILD, "writer", "--dst", spec.dst_addr, "--port", str(spec.port), "--cc", spec.cc,
            "--size", str(spec.write_size), "--interval-ns", str(spec.interval_ns), "--dist", spec.dist,
            "--seed", str(spec.seed), "--connect-ns", str(spec.connect_ns), "--first-ns", str(spec.first_ns),
            "--end-ns", str(spec.end_ns), "--limit", str(limits.MAX_APP_WRITES), "--out", str(out)]
    return argv + (["--nodelay"] if spec.nodelay else [])


def sink_argv(spec, out: Path) -> list[str]:
    """argv of the sink child (pure); the sink listens on every address of its namespace, as iperf3 -s."""
    return [*CHILD, "sink", "--port", str(spec.port), "--end-ns", str(spec.stop_ns), "--out", str(out)]


def bulk_argv(spec, out: Path) -> list[str]:
    """argv of the bulk sender child (pure): one --flow item per flow."""
    flows = [a for f in spec.flows for a in ("--flow", flow_arg(f))]
    return [*BULK_CHILD, *flows, "--connect-ns", str(spec.connect_ns), "--first-ns", str(spec.first_ns),
            "--out", str(out)]


class _AppChild(TaskRunner):
    """One child process; its log (the artifact) is `log_name` with the task's port, its argv `build_argv`."""

    artifact_kind = ""
    log_name = ""

    @staticmethod
    def build_argv(spec, out: Path) -> list[str]:
        raise NotImplementedError

    def deadline_ns(self) -> int:
        raise NotImplementedError

    @property
    def port(self) -> int:
        return self.spec.port

    @property
    def out_name(self) -> str:
        return self.log_name.format(port=self.port)

    def argv(self) -> list[str]:
        return self.build_argv(self.spec, self.run_dir / self.out_name)

    async def execute(self) -> None:
        env = {**os.environ, "PYTHONPATH": PACKAGE_ROOT, "PYTHONDONTWRITEBYTECODE": "1"}
        proc = await spawn(self.argv(), stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
                           env=env, cwd=str(self.run_dir))
        stopper = asyncio.ensure_future(self.stop_event.wait())
        waiter = asyncio.ensure_future(proc.wait())
        timeout = max(0.0, (self.deadline_ns() - time.time_ns()) / 1e9) + EXIT_GRACE_S
        await asyncio.wait({stopper, waiter}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        await procs.terminate(proc)
        stderr = (await proc.stderr.read()).decode(errors="replace") if proc.stderr else ""
        self.meta.update({"returncode": proc.returncode, "stderr": stderr[-2000:]})
        if proc.returncode != 0 and not self.stop_event.is_set():
            raise RuntimeError(f"{self.kind} port {self.port} exited {proc.returncode}: "
                               f"{stderr.strip()[-300:]}")


class AppWriter(_AppChild):
    kind, log_name, build_argv = "app_writer", "app-writer-{port}.bin", staticmethod(writer_argv)

    def deadline_ns(self) -> int:
        return self.spec.end_ns


class AppSink(_AppChild):
    kind, log_name, build_argv = "app_sink", "app-sink-{port}.bin", staticmethod(sink_argv)

    def deadline_ns(self) -> int:
        return self.spec.stop_ns


class BulkSender(_AppChild):
    kind, log_name, build_argv = "bulk_sender", "bulk-send-{port}.json", staticmethod(bulk_argv)

    @property
    def port(self) -> int:
        return self.spec.flows[0].port    # its name: the first flow's port (ports are unique in a run)

    def deadline_ns(self) -> int:
        return max(f.end_ns for f in self.spec.flows) + DRAIN_NS   # it waits for its sinks to read all
