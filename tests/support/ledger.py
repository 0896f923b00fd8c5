"""The fault-and-fuzz ledger: every fault-injection and fuzz test records what it did, and the session ends
with one summary line (faults injected, survived, runs lost, fuzz cases, crashes) that CI logs keep.

A test takes the `ledger` fixture and calls `fault(...)` once per injected fault or `fuzz(...)` once per
batch of fuzzed inputs; it still asserts its own figures (runs lost 0, crashes 0). The line is the sum of
what ran: a skipped test adds nothing, so a summary with 0 faults shows the suite did not run."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Ledger:
    faults_injected: int = 0
    faults_survived: int = 0
    runs_lost: int = 0
    fuzz_cases: int = 0
    crashes: int = 0
    hangs: int = 0
    lines: list[str] = field(default_factory=list)

    def fault(self, name: str, survived: bool, runs_lost: int = 0, detail: str = "") -> None:
        """One injected fault: did the system survive it (the property the test checks), and how many
        completed runs went missing from the database because of it."""
        self.faults_injected += 1
        self.faults_survived += int(survived)
        self.runs_lost += runs_lost
        self.lines.append(f"fault {name}: {'survived' if survived else 'NOT survived'}, runs lost {runs_lost}"
                          + (f" ({detail})" if detail else ""))

    def fuzz(self, name: str, cases: int, crashes: int, hangs: int = 0, detail: str = "") -> None:
        """One batch of fuzzed inputs: a crash is an uncoded error or a traceback, a hang a case over its
        time bound."""
        self.fuzz_cases += cases
        self.crashes += crashes
        self.hangs += hangs
        self.lines.append(f"fuzz {name}: {cases} cases, {crashes} crashes, {hangs} hangs"
                          + (f" ({detail})" if detail else ""))

    def summary(self) -> str:
        return (f"fault-and-fuzz: faults injected {self.faults_injected}, survived {self.faults_survived}, "
                f"runs lost {self.runs_lost}, fuzz cases {self.fuzz_cases}, crashes {self.crashes}, "
                f"hangs {self.hangs}")
