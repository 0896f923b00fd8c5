"""GRUB's environment block and boot choice (orchestrator/lab/grubenv.py), on blocks grub-editenv wrote."""
from pathlib import Path

import pytest

from orchestrator.lab import grubenv

FIXTURES = Path(__file__).parents[1] / "fixtures" / "grub"
OLD, NEW = "6.1.0-50-amd64", "6.12.117+deb12-amd64"


def test_parse_and_render_match_grub_editenv_byte_for_byte():
    for name in ("grubenv-next-entry", "grubenv-empty"):
        block = (FIXTURES / name).read_bytes()
        assert len(block) == grubenv.SIZE
        assert grubenv.render(grubenv.parse(block)) == block
    env = grubenv.parse((FIXTURES / "grubenv-next-entry").read_bytes())
    assert env == {"saved_entry": grubenv.debian_title(OLD), "next_entry": grubenv.debian_title(NEW)}


def test_next_entry_boots_once_then_the_saved_default():
    env = grubenv.parse((FIXTURES / "grubenv-next-entry").read_bytes())
    first = grubenv.choose(env, [OLD, NEW])
    assert (first.release, first.why) == (NEW, "next_entry (one-shot)")
    assert first.env_after["next_entry"] == "" and first.env_after["saved_entry"] == env["saved_entry"]
    second = grubenv.choose(first.env_after, [OLD, NEW])       # e.g. the new kernel panicked: a reset
    assert (second.release, second.why) == (OLD, "saved_entry")


def test_without_entries_the_newest_kernel_by_version_order():
    assert grubenv.choose({}, ["6.1.0-9-amd64", "6.1.0-50-amd64", "6.12.117+deb12-amd64"]).release == \
        "6.12.117+deb12-amd64"
    assert grubenv.choose({}, ["6.1.0-9-amd64", "6.1.0-50-amd64"]).release == "6.1.0-50-amd64"


def test_an_entry_naming_no_installed_kernel_falls_back_and_says_so():
    choice = grubenv.choose({"next_entry": grubenv.debian_title("9.9.9")}, [OLD])
    assert choice.release == OLD and choice.env_after["next_entry"] == ""
    assert "names no kernel in /boot" in choice.fallback


def test_entries_as_bare_releases_and_menu_indexes():
    assert grubenv.choose({"saved_entry": OLD}, [OLD, NEW]).release == OLD
    assert grubenv.choose({"saved_entry": "1"}, [OLD, NEW]).release == OLD
    assert grubenv.entry_release(grubenv.debian_title(NEW) + " (recovery mode)") == NEW


def test_bad_blocks_are_refused():
    with pytest.raises(grubenv.GrubEnvError):
        grubenv.parse(b"saved_entry=x\n")
    with pytest.raises(grubenv.GrubEnvError):
        grubenv.render({"k": "v" * 2000})
    with pytest.raises(grubenv.GrubEnvError):
        grubenv.choose({}, [])
