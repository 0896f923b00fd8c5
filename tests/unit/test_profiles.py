"""Testbed profiles (docs/profiles.md): loading with located errors, kernel substitutions, rate/delay scaling,
capture placement, what every run records, `plan expand --profile`, and what `lab up --profile` is asked."""
from __future__ import annotations

import io
import json

import pytest

from orchestrator.guards.pre_run import refusing
from orchestrator.lab.netns import LabError
from orchestrator.lab.request import lab_request
from orchestrator.lab.vm_recipe import newest_matching
from orchestrator.plan import PlanError, expand, load_plan, load_plan_text
from orchestrator.plan.checks.profile_loader import load_profile, load_profile_text
from orchestrator.plan.commands import cmd_expand
from orchestrator.plan.expansion.adapt import readable_factor
from orchestrator.plan.model.kernels import release_matches
from tests.support.shipped import PROFILE_DIR, PROFILES, ROOT, STUDY_PLANS

PLAN = """
name: prof
roles: [sender, aqm, receiver]
kernels:
  stock: {vanilla: true, source: {git: https://example.org/linux.git, ref: v5.9}, release: 5.9.0-stock}
  patched:
    vanilla: false
    source: {git: https://example.org/linux.git, ref: v5.9, patches: [patches/fix.patch], localversion: -fix}
    modules: [modules/tcp_x]
    release: 5.9.0-fix
  modonly: {vanilla: false, package: linux-image-4.9.0-4-amd64, modules: [modules/sch_aqm_mark]}
run:
  duration: 10s
  base_rtt: 1ms
  bottleneck:
    at: {host: aqm, toward: receiver}
    rate: 1gbit
    delay: 1ms
    line_rate: 10gbit
    queue: {kind: red, mode: step, min: 100us}
  traffic: {src: sender, dst: receiver, cc: dctcp, flows: 2, stagger: 1s, duration: 8s}
  hosts:
    sender: {kernel: stock}
    aqm: {kernel: modonly}
    receiver: {kernel: patched}
matrix:
  axes:
    bottleneck.rate: [500mbit, 1gbit]
"""

VM = """
name: vmtest
testbed: {kind: vm, kernel: linux-image-6.1.0-*-amd64}
kernels:
  - {match: "*", package: linux-image-6.1.0-*-amd64, source: linux-source-6.1, why: debian 6.1 only}
scale: {max_rate: 50mbit}
captures: {move_off: [aqm], snaplen: 96}
"""


def plan():
    return load_plan_text(PLAN, "prof.yaml")


def test_the_shipped_profiles_load_and_adapt_every_study_plan():
    assert {p.name for p in PROFILES} == {"netns-lab.yaml", "uml-lab.yaml", "vm-lab.yaml"}
    for path in PROFILES:
        profile = load_profile(path)
        assert profile.name == path.stem
        for plan_path in STUDY_PLANS:
            runs = expand(load_plan(plan_path), profile=profile)
            assert runs and all(r.profile is not None and r.profile.name == profile.name for r in runs), plan_path
            # scaled values still satisfy the pitfall guards a run is refused by (netem limit, htb burst, ...)
            assert [f"{r.run_id}: {f}" for r in runs for f in refusing(r)] == []


def test_a_bad_profile_names_file_line_and_field():
    text = ("version: 1\nname: x\ntestbed: {kind: vm, guests: 3}\nscale: {max_rate: 10zbit}\n"
            "kernels:\n  - match: '*'\n    runing: true\n")
    with pytest.raises(PlanError) as e:
        load_profile_text(text, "bad.yaml")
    lines = [str(i) for i in e.value.issues]
    assert "bad.yaml:4:19: scale.max_rate: unknown rate unit 'zbit'; use one of bit, kbit, mbit, gbit, tbit, " \
           "kibit, mibit, gibit, tibit" in lines
    assert "bad.yaml:7:5: kernels[0].runing: unknown field 'runing'; did you mean 'running'?" in lines
    assert any(line.startswith("bad.yaml:3:29: testbed.guests:") for line in lines)


@pytest.mark.parametrize("rule, message", [
    ("{match: '*'}", "a kernel rule gives"),
    ("{match: '*', running: true}", "`running: true` stands alone and needs `vanilla: true`"),
    ("{match: '*', package: linux-image-6.1.0-*-amd64, running: true, vanilla: true}", "stands alone"),
    ("{match: '*', source: linux-source-6.1.0}", "should match pattern"),
])
def test_kernel_rules_that_cannot_substitute_are_refused(rule, message):
    with pytest.raises(PlanError, match=message.replace("*", r"\*").replace("(", r"\(")):
        load_profile_text(f"name: x\ntestbed: {{kind: vm}}\nkernels:\n  - {rule}\n", "p.yaml")


def test_kernel_substitutions_keep_what_the_study_added():
    runs = expand(plan(), profile=load_profile_text(VM))
    hosts = runs[0].hosts
    assert hosts["sender"].kernel.release == "6.1.0-*-amd64" and hosts["sender"].kernel.vanilla
    assert hosts["aqm"].kernel.release == "6.1.0-*-amd64" and not hosts["aqm"].kernel.vanilla
    assert hosts["receiver"].kernel.release is None          # a build of linux-source-6.1: known once built
    subs = {s.field: s for s in runs[0].substitutions if s.kind == "kernel"}
    assert subs["kernels.stock"].now == "package linux-image-6.1.0-*-amd64"
    assert subs["kernels.modonly"].was == "package linux-image-4.9.0-4-amd64"
    assert subs["kernels.patched"].now == "source linux-source-6.1 + 1 patch(es)"
    assert {s.why for s in subs.values()} == {"debian 6.1 only"}
    plain = expand(plan())[0].hosts
    assert {r: h.kernel.sha256 for r, h in hosts.items()}.keys() == plain.keys()
    assert all(hosts[r].kernel.sha256 != plain[r].kernel.sha256 for r in hosts)   # G-VARIANT: new content


def test_the_first_matching_rule_wins_and_filters_by_vanilla():
    text = ("name: n\ntestbed: {kind: netns}\nkernels:\n  - {match: '*', vanilla: true, running: true}\n"
            "  - {match: 'mod*', package: linux-image-6.12.0-*-amd64}\n")
    runs = expand(plan(), profile=load_profile_text(text))
    hosts = runs[0].hosts
    assert hosts["sender"].kernel is None                     # the running kernel stands in: no requirement
    assert hosts["aqm"].kernel.release == "6.12.0-*-amd64"
    assert hosts["receiver"].kernel.release == "5.9.0-fix"    # no rule matched: the study's build
    subs = {s.field: s.now for s in runs[0].substitutions if s.kind == "kernel"}
    assert subs == {"kernels.stock": "the kernel the host runs (recorded per run)",
                    "kernels.modonly": "package linux-image-6.12.0-*-amd64"}


def test_a_build_rule_stands_a_variant_of_another_file_in_with_its_paths_from_the_plan(tmp_path):
    """experiments/profiles/uml-lab.yaml stands the thin-stream study's linux-3.15 in by the lab's
    uml-6.1-cwnd-3.15: that variant as experiments/kernels/uml-lab.yaml declares it, its patches and modules
    then named from the study plan's directory, so the build is the same (the key hashes contents) and the run
    ids do not depend on where the clone is."""
    from orchestrator.kernel.sources import resolve
    from orchestrator.plan.expansion.adapt import effective_kernels

    profile = load_profile(PROFILE_DIR / "uml-lab.yaml")
    study = load_plan(ROOT / "experiments/thin-stream/thin-stream.yaml")
    kernels = effective_kernels(study.kernels, profile, study.source_dir)
    lab = load_plan(ROOT / "experiments/kernels/uml-lab.yaml").kernels["uml-6.1-cwnd-3.15"]
    stood = kernels["linux-3.15"]
    assert stood.source.patches == [f"../kernels/{p}" for p in lab.source.patches]
    assert stood.source.config == [f"../kernels/{c}" for c in lab.source.config]
    assert stood.modules == ["../modules/sch_aqm_mark", "../modules/tcp_dctcp_flaws"] == lab.modules
    assert (stood.vanilla, stood.description) == (study.kernels["linux-3.15"].vanilla,
                                                  study.kernels["linux-3.15"].description)
    assert "linux-3.18" not in kernels                      # the running (stock) kernel stands in for 3.18
    # the same files found from either directory: the same build inputs, so the same cache entry
    assert [f.sha256 for f in resolve("linux-3.15", stood, ROOT / "experiments/thin-stream").patches] == \
        [f.sha256 for f in resolve("uml-6.1-cwnd-3.15", lab, ROOT / "experiments/kernels").patches]
    (run,) = [r for r in expand(study, profile=profile) if r.experiment == "thin-f5" and r.repetition == 0
              and r.params["sender_kernel"] == "linux-3.15"]
    (sub,) = [s for s in run.substitutions if s.field == "kernels.linux-3.15"]
    assert sub.now.startswith("variant uml-6.1-cwnd-3.15 of ../kernels/uml-lab.yaml (source linux-source-6.1 + 6 ")
    # a clone elsewhere gives the same run ids
    import shutil

    copy = tmp_path / "clone"
    for part in ("experiments/thin-stream", "experiments/kernels", "experiments/profiles", "experiments/modules"):
        shutil.copytree(ROOT / part, copy / part)
    there = expand(load_plan(copy / "experiments/thin-stream/thin-stream.yaml"),
                   profile=load_profile(copy / "experiments/profiles/uml-lab.yaml"))
    assert [r.run_id for r in there] == [r.run_id for r in expand(study, profile=profile)]


@pytest.mark.parametrize("build, field, message", [
    ("{plan: ../kernels/uml-lab.yaml, variant: nope}", "variant", "../kernels/uml-lab.yaml declares no source "
     "variant 'nope' (it has: uml-6.1, uml-6.1-cwnd-3.15, uml-6.1-prr-5.9)"),
    ("{plan: ../kernels/none.yaml, variant: uml-6.1}", "plan", "../kernels/none.yaml: "),
])
def test_a_build_rule_names_a_variant_its_file_declares(tmp_path, build, field, message):
    import shutil

    line = f"  - {{match: '*', build: {build}}}"
    col = line.index(build.split(f"{field}: ")[1].split(",")[0].rstrip("}")) + 1
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "p.yaml").write_text(f"name: x\ntestbed: {{kind: uml}}\nkernels:\n{line}\n")
    shutil.copytree(ROOT / "experiments/kernels", tmp_path / "kernels")
    with pytest.raises(PlanError) as e:
        load_profile(tmp_path / "profiles" / "p.yaml")
    assert str(e.value).startswith(f"{tmp_path / 'profiles' / 'p.yaml'}:4:{col}: kernels[0].build.{field}: {message}")
    with pytest.raises(PlanError, match="`build` stands alone"):
        load_profile_text("name: x\ntestbed: {kind: uml}\nkernels:\n  - {match: '*', "
                          "package: linux-image-6.1.0-1-amd64, build: {plan: a.yaml, variant: v}}\n", "q.yaml")


def test_scaling_keeps_the_path_in_packets():
    plain = {r.params["rate"]: r for r in expand(plan()) if r.repetition == 0}
    runs = {r.params["rate"]: r for r in expand(plan(), profile=load_profile_text(VM)) if r.repetition == 0}
    assert runs["1gbit"].profile.scale_factor == 0.05           # 50mbit / 1gbit
    for rate, r in runs.items():
        p = plain[rate]
        assert r.params == p.params                               # params name the study's cell
        assert r.derived.bottleneck_rate_bit == p.derived.bottleneck_rate_bit // 20
        assert r.derived.base_rtt_us == p.derived.base_rtt_us * 20
        assert r.derived.bdp_bytes == p.derived.bdp_bytes
        assert r.derived.step_k_bytes == p.derived.step_k_bytes
        assert r.derived.per_flow_window_segments == p.derived.per_flow_window_segments
        assert [(f.start_s, f.duration_s) for f in r.flows] == [(f.start_s, f.duration_s) for f in p.flows]
        assert r.duration_s == p.duration_s
    changed = {s.field: (s.was, s.now) for s in runs["500mbit"].substitutions if s.kind != "kernel"}
    assert changed["bottleneck.rate"] == ("500mbit", "25mbit")
    assert changed["bottleneck.delay"] == ("1ms", "20ms")
    assert changed["bottleneck.queue.min"] == ("100us", "2ms")
    assert changed["bottleneck.line_rate"] == ("10gbit", "500mbit")
    assert "traffic.duration" not in changed and "traffic.stagger" not in changed


def test_keep_delay_changes_only_the_rates():
    profile = load_profile_text("name: d\ntestbed: {kind: vm}\nscale: {factor: 0.1, keep: delay}\n")
    r, p = expand(plan(), profile=profile)[0], expand(plan())[0]
    assert r.derived.base_rtt_us == p.derived.base_rtt_us
    assert r.derived.bdp_bytes * 10 == p.derived.bdp_bytes
    assert {s.kind for s in r.substitutions} == {"rate"}


@pytest.mark.parametrize("limit, factor", [(1.0, 1.0), (3.0, 1.0), (0.0833, 0.05), (0.5, 0.5), (0.25, 0.2),
                                           (0.01, 0.01), (0.0099, 0.005), (0.19999, 0.1)])
def test_the_factor_is_readable(limit, factor):
    assert readable_factor(limit) == factor


def test_captures_move_off_a_host_and_snaplen_is_capped():
    r = expand(plan(), profile=load_profile_text(VM))[0]
    # the plan's default points: aqm toward receiver and toward sender -> the other ends of those links
    assert [(c.link.host, c.link.toward, c.snaplen) for c in r.captures] == [
        ("receiver", "aqm", 96), ("sender", "aqm", 96)]
    moved = [s for s in r.substitutions if s.kind == "capture" and s.field == "aqm:to-receiver"]
    assert moved[0].now == "receiver:to-aqm"


def test_a_capture_toward_a_switch_stays_and_says_so():
    chirp = load_plan(ROOT / "experiments/paced-chirping/chirping.yaml")
    profile = load_profile_text("name: c\ntestbed: {kind: vm}\ncaptures: {move_off: [aqm, receiver_a]}\n")
    r = next(r for r in expand(chirp, profile=profile) if r.captures)
    kept = [s for s in r.substitutions if s.kind == "capture" and s.now == s.was]
    assert all(s.why.startswith("kept:") for s in kept)
    assert all(c.link.host != "aqm" or c.link.label in {s.field for s in kept} for c in r.captures)


def test_run_ids_follow_the_profile_not_its_description():
    a = [r.run_id for r in expand(plan(), profile=load_profile_text(VM))]
    b = [r.run_id for r in expand(plan(), profile=load_profile_text(VM + "description: other words\n"))]
    c = [r.run_id for r in expand(plan(), profile=load_profile_text(VM.replace("50mbit", "100mbit")))]
    plain = [r.run_id for r in expand(plan())]
    assert a == b and len(set(a)) == len(a)
    assert not set(a) & set(c) and not set(a) & set(plain)


def test_a_run_records_its_profile_and_a_plain_run_writes_no_new_keys():
    adapted = expand(plan(), profile=load_profile_text(VM))[0].model_dump(mode="json")
    assert adapted["profile"]["name"] == "vmtest" and adapted["substitutions"]
    plain = expand(plan())[0].model_dump(mode="json")
    assert "profile" not in plain and "substitutions" not in plain


def test_plan_expand_shows_the_effective_runs():
    out, err = io.StringIO(), io.StringIO()
    assert cmd_expand(ROOT / "experiments/lsaimd/table-5-1.yaml", out=out, err=err,
                      profile=PROFILE_DIR / "vm-lab.yaml") == 0
    lines = out.getvalue().splitlines()
    # one factor per experiment: 1 ... 3B at 200 Mbit/s need x0.2 under 50 Mbit/s, 4A ... 4H (1 Gbit/s) x0.05
    assert lines[0].startswith("# profile vm-lab (sha256 ") and lines[0].endswith(
        "rates x0.2 (1, 2, 3A, 3B), x0.05 (4A, 4B, 4C, 4D, 4E, 4F, 4G, 4H)")
    assert any(line.startswith("# kernels.lsaimd-5.0.0: source https://git.kernel.org/") and
               "-> source linux-source-6.1 + 1 patch(es)" in line for line in lines)
    assert "bottleneck.rate 200mbit->40mbit" in lines[lines.index(next(x for x in lines if x.startswith("lsaimd-")))
                                                          + 1]
    as_json = io.StringIO()
    assert cmd_expand(ROOT / "experiments/lsaimd/table-5-1.yaml", as_json=True, out=as_json, err=err,
                      profile=PROFILE_DIR / "vm-lab.yaml") == 0
    assert all(r["profile"]["name"] == "vm-lab" for r in json.loads(as_json.getvalue()))


def test_a_bad_profile_stops_plan_expand_with_its_location(tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text("name: p\ntestbed: {kind: cloud}\n")
    out, err = io.StringIO(), io.StringIO()
    assert cmd_expand(ROOT / "experiments/quickstart.yaml", out=out, err=err, profile=bad) == 2
    assert err.getvalue().startswith(f"{bad}:2:17: testbed.kind:") and out.getvalue() == ""


def test_lab_up_with_the_vm_profile_makes_guests_of_the_hosts_with_kernels(tmp_path):
    vm = PROFILE_DIR / "vm-lab.yaml"
    req = lab_request(None, ROOT / "experiments/dctcp-flaws/dc.yaml", vm, None, None)
    assert (req.kind, req.vm_roles, req.kernel) == ("vm", ("sender", "aqm", "receiver"), "linux-image-6.1.0-*-amd64")
    req = lab_request(None, ROOT / "experiments/paced-chirping/chirping.yaml", vm, None, "aqm")
    assert req.vm_roles == ("aqm",) and req.graph is not None and req.graph.switches == ("switch",)
    req = lab_request(None, ROOT / "experiments/quickstart.yaml", PROFILE_DIR / "netns-lab.yaml", None, None)
    assert (req.kind, req.vm_roles, req.kernel) == ("netns", (), None)
    with pytest.raises(LabError, match="is for a vm lab"):
        lab_request("netns", ROOT / "experiments/quickstart.yaml", vm, None, None)
    with pytest.raises(LabError, match="--kernel linux-image-6.12.0-1-amd64, but profile vm-lab asks for"):
        lab_request(None, ROOT / "experiments/vm/dctcp.yaml", vm, "linux-image-6.12.0-1-amd64", None)
    physical = tmp_path / "hw.yaml"
    physical.write_text("name: hw\ntestbed: {kind: physical}\n")
    with pytest.raises(LabError, match="physical testbed"):
        lab_request(None, ROOT / "experiments/quickstart.yaml", physical, None, None)


def test_a_package_pattern_matches_the_abi_number_only():
    assert release_matches("6.1.0-*-amd64", "6.1.0-56-amd64")
    assert not release_matches("6.1.0-*-amd64", "6.1.0-56-cloud-amd64")
    assert not release_matches("6.1.0-*-amd64", "6.1.0--amd64")
    assert release_matches(None, "anything") and release_matches("5.9.0-stock", "5.9.0-stock")
    names = ["linux-image-6.1.0-9-amd64", "linux-image-6.1.0-56-amd64", "linux-image-6.1.0-56-cloud-amd64",
             "linux-image-6.1.0-100-rt-amd64"]
    assert newest_matching(names, "linux-image-6.1.0-*-amd64") == "linux-image-6.1.0-56-amd64"
    assert newest_matching(names, "linux-image-6.1.0-9-amd64") == "linux-image-6.1.0-9-amd64"
    assert newest_matching(names, "linux-image-6.12.0-*-amd64") is None


def test_each_experiment_is_scaled_only_as_far_as_its_own_rates_need():
    """tbtcp's 9 Gbit/s tb-e15 must not slow its 10 Mbit/s tb-e6 down 200-fold (a 30 ms RTT would become 6 s)."""
    runs = expand(load_plan(ROOT / "experiments/timer-cc/tbtcp.yaml"),
                  profile=load_profile(PROFILE_DIR / "vm-lab.yaml"))
    factor = {r.experiment: r.profile.scale_factor for r in runs}
    assert factor["tb-e6"] == factor["tb-b1"] == 1.0 and factor["tb-e15"] == 0.005
    e6 = next(r for r in runs if r.experiment == "tb-e6")
    assert e6.derived.bottleneck_rate_bit == 10_000_000 and e6.derived.base_rtt_us == 30_000
    # a sweep inside one experiment keeps its ratios: every run of it has the one factor
    assert len({r.profile.scale_factor for r in runs if r.experiment == "tb-e15"}) == 1
