"""The CLI, used as a new user would: a missing run folder, an impossible port and a mistyped database each give
one line and exit 2 -- no traceback, and nothing created on the way."""
from __future__ import annotations

import pytest

from orchestrator.cli import main


def _run(argv: list[str], capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as done:
        main(argv)
    out = capsys.readouterr()
    return done.value.code, out.out + out.err


def test_ingest_of_a_folder_that_is_not_a_run(tmp_path, capsys):
    code, said = _run(["ingest", str(tmp_path / "nosuch"), "--db", f"sqlite:///{tmp_path / 'r.db'}"], capsys)
    assert code == 2 and "not a run folder" in said and "Traceback" not in said


def test_serve_refuses_a_port_out_of_range(capsys):
    code, said = _run(["serve", "--port", "99999"], capsys)
    assert code == 2 and "99999 is not a TCP port" in said


@pytest.mark.parametrize("command", [["table"], ["report"], ["compare", "plan:a", "plan:b"]])
def test_read_commands_refuse_a_database_that_does_not_exist(command, tmp_path, capsys):
    typo = tmp_path / "typo.db"
    code, said = _run([*command, "--db", f"sqlite:///{typo}"], capsys)
    assert code == 2 and f"no result database at {typo}" in said
    assert not typo.exists()
