"""Rules that relate fields to each other, each reported at the field a researcher has to change.

Three groups: `assignment_problems` (every varied value names a real field and fits its type; works on
the raw document so it runs even when other parts of the plan are broken), `plan_problems` (names,
arms, matrix shape, conflicting assignments) and `run_problems` (one resolved run: roles, flows
inside the run, ports, bursts, intervals). All return `Problem`s; none raises.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from pydantic import ValidationError

from orchestrator.plan.build import flow_plans
from orchestrator.plan.derive import red_bytes, wire_frame_bytes
from orchestrator.plan.diagnose import problems_from
from orchestrator.plan.errors import Path, Problem, format_path
from orchestrator.plan.matrix import MAX_RUNS, Assignment, adapter, count_runs, target, value_key, views
from orchestrator.plan.model import Plan
from orchestrator.plan.paths import PathError
from orchestrator.plan.template import ALL_HOSTS, HtbStage, RedQueue, RunTemplate
from orchestrator.plan.units import format_rate, format_time_ns

RESERVED_PARAMS = frozenset({"arm", "experiment", "repetition"})


# ------------------------------------------------------------------ assignments (raw document)

def _items(section: Any, key_origin: Path, indexed: bool) -> Iterator[tuple[str, Any, Path, Path]]:
    """(dotted, value, value path, key path) of a `set`-like mapping or an `axes`-like mapping of lists."""
    if not isinstance(section, dict):
        return
    for dotted, value in section.items():
        if not isinstance(dotted, str):
            continue  # the model reports non-string keys
        key_path = key_origin + (dotted,)
        if indexed:
            for k, v in enumerate(value if isinstance(value, list) else []):
                yield dotted, v, key_path + (k,), key_path
        else:
            yield dotted, value, key_path, key_path


def _matrix_items(m: Any, origin: Path) -> Iterator[tuple[str, Any, Path, Path]]:
    if not isinstance(m, dict):
        return
    yield from _items(m.get("axes"), origin + ("axes",), True)
    for g, group in enumerate(m.get("zip") if isinstance(m.get("zip"), list) else []):
        yield from _items(group, origin + ("zip", g), True)
    for name in ("include", "exclude"):
        for n, entry in enumerate(m.get(name) if isinstance(m.get(name), list) else []):
            yield from _items(entry, origin + (name, n), False)


def _assignment_items(doc: Any) -> Iterator[tuple[str, Any, Path, Path]]:
    if not isinstance(doc, dict):
        return
    yield from _matrix_items(doc.get("matrix"), ("matrix",))
    for i, arm in enumerate(doc.get("arms") if isinstance(doc.get("arms"), list) else []):
        if isinstance(arm, dict):
            yield from _items(arm.get("set"), ("arms", i, "set"), False)
    for i, exp in enumerate(doc.get("experiments") if isinstance(doc.get("experiments"), list) else []):
        if isinstance(exp, dict):
            yield from _items(exp.get("set"), ("experiments", i, "set"), False)
            yield from _matrix_items(exp.get("matrix"), ("experiments", i, "matrix"))


def assignment_problems(doc: Any) -> list[Problem]:
    """Every varied value must name a field of the run template and be a valid value for it."""
    out: list[Problem] = []
    bad_keys: set[Path] = set()
    names = doc.get("param_names") if isinstance(doc, dict) else None
    for dotted in names if isinstance(names, dict) else {}:
        if isinstance(dotted, str):
            try:
                target(dotted)
            except PathError as exc:
                out.append(Problem(("param_names", dotted), str(exc), at_key=True))
    for dotted, value, value_path, key_path in _assignment_items(doc):
        try:
            ta = adapter(dotted)
        except PathError as exc:
            if key_path not in bad_keys:
                bad_keys.add(key_path)
                out.append(Problem(key_path, str(exc), at_key=True))
            continue
        if ta is None:
            continue
        try:
            ta.validate_python(value)
        except ValidationError as exc:
            out += [Problem(value_path + p.path, p.message, p.at_key)
                    for p in problems_from(exc, value, target(dotted).annotation)]
    return out


# ------------------------------------------------------------------ plan-level rules (typed plan)

def _duplicates(names: list[str], prefix: Path, what: str) -> list[Problem]:
    first: dict[str, int] = {}
    out = []
    for i, name in enumerate(names):
        if name in first:
            out.append(Problem(prefix + (i, "name"), f"duplicate {what} name {name!r} (also "
                               f"{format_path(prefix + (first[name],))})"))
        first.setdefault(name, i)
    return out


def _repeated(keys: list[str], path: Path) -> list[Problem]:
    """A value listed twice on one axis would run the same cell twice."""
    first: dict[str, int] = {}
    out = []
    for k, key in enumerate(keys):
        if key in first:
            out.append(Problem(path + (k,), f"same value as [{first[key]}] (compared in kernel units)"))
        first.setdefault(key, k)
    return out


def _matrix_shape(plan: Plan) -> list[Problem]:
    out: list[Problem] = []
    seen_origins: set[Path] = set()
    for view in views(plan):
        m, origin = view.matrix, view.matrix_origin
        if origin in seen_origins:
            continue
        seen_origins.add(origin)
        varied: dict[Path, Path] = {}
        for d, values in m.axes.items():
            varied.setdefault(target(d).path, origin + ("axes", d))
            out += _repeated([value_key(Assignment(d, (), v, ())) for v in values], origin + ("axes", d))
        for g, group in enumerate(m.zip):
            rows = list(zip(*(([value_key(Assignment(d, (), v, ())) for v in vs]) for d, vs in group.items()),
                            strict=False))
            out += _repeated([repr(r) for r in rows], origin + ("zip", g, next(iter(group), "")))
        for g, group in enumerate(m.zip):
            if not group:
                out.append(Problem(origin + ("zip", g), "a zip group needs at least one field"))
            lengths = {d: len(v) for d, v in group.items()}
            first = next(iter(lengths), None)
            for d, n in lengths.items():
                if first is not None and n != lengths[first]:
                    out.append(Problem(origin + ("zip", g, d), f"has {n} values but {first!r} has "
                                       f"{lengths[first]}; zipped lists vary together and must be equally long"))
            for d in group:
                p = target(d).path
                if p in varied:
                    out.append(Problem(origin + ("zip", g, d), f"also varied by {format_path(varied[p])}",
                                       at_key=True))
                varied.setdefault(p, origin + ("zip", g, d))
        for n, entry in enumerate(m.exclude):
            for d in entry:
                if target(d).path not in varied:
                    out.append(Problem(origin + ("exclude", n, d), "exclude can only name the matrix's axes "
                                       "and zip fields", at_key=True))
    return out


def _conflicts(plan: Plan) -> list[Problem]:
    """A field set at two levels (experiment, arm, matrix) would silently lose one value."""
    out: list[Problem] = []
    for view in views(plan):
        m = view.matrix
        matrix_paths: dict[Path, Path] = {}
        for d in m.axes:
            matrix_paths.setdefault(target(d).path, view.matrix_origin + ("axes", d))
        for g, group in enumerate(m.zip):
            for d in group:
                matrix_paths.setdefault(target(d).path, view.matrix_origin + ("zip", g, d))
        for n, entry in enumerate(m.include):
            for d in entry:
                matrix_paths.setdefault(target(d).path, view.matrix_origin + ("include", n, d))
        arm_paths = {target(d).path: ("arms", j, "set", d) for j, arm in view.arms for d in arm.set}
        for a in view.sets:
            for other in (arm_paths, matrix_paths):
                if a.path in other:
                    out.append(Problem(a.origin, f"also set by {format_path(other[a.path])}", at_key=True))
        for p, origin in arm_paths.items():
            if p in matrix_paths:
                out.append(Problem(origin, f"also set by {format_path(matrix_paths[p])}", at_key=True))
    return out


def _all_assignments(plan: Plan) -> Iterator[Assignment]:
    for view in views(plan):
        yield from view.sets
        m, o = view.matrix, view.matrix_origin
        yield from (Assignment(d, target(d).path, None, o + ("axes", d)) for d in m.axes)
        yield from (Assignment(d, target(d).path, None, o + ("zip", g, d))
                    for g, group in enumerate(m.zip) for d in group)
        yield from (Assignment(d, target(d).path, None, o + ("include", n, d))
                    for n, entry in enumerate(m.include) for d in entry)
    yield from (Assignment(d, target(d).path, None, ("arms", j, "set", d))
                for j, arm in enumerate(plan.arms) for d in arm.set)


def param_name(plan: Plan, dotted: str) -> str:
    """Name of a varied field in the run params: `param_names` or the last path segment."""
    return plan.param_names.get(dotted, dotted.rsplit(".", 1)[-1])


def _param_names(plan: Plan) -> list[Problem]:
    paths_by_name: dict[str, dict[Path, Assignment]] = defaultdict(dict)
    for a in _all_assignments(plan):
        paths_by_name[param_name(plan, a.dotted)].setdefault(a.path, a)
    out = []
    for name, by_path in paths_by_name.items():
        if name in RESERVED_PARAMS:
            first = next(iter(by_path.values()))
            out.append(Problem(first.origin, f"the param name {name!r} is reserved; rename it in "
                               "param_names", at_key=True))
        if len(by_path) > 1:
            dotted = sorted(a.dotted for a in by_path.values())
            for a in by_path.values():
                out.append(Problem(a.origin, f"param name {name!r} would stand for {' and '.join(dotted)}; "
                                   "give one of them a name in param_names", at_key=True))
    return out


def plan_problems(plan: Plan) -> list[Problem]:
    """Plan-wide rules. Assumes assignment_problems found nothing (every path resolves)."""
    out = _duplicates([e.name for e in plan.experiments], ("experiments",), "experiment")
    out += _duplicates([a.name for a in plan.arms], ("arms",), "arm")
    if len(set(plan.roles)) != len(plan.roles) or ALL_HOSTS in plan.roles:
        out.append(Problem(("roles",), f"roles must be distinct and not {ALL_HOSTS!r}"))
    arm_names = [a.name for a in plan.arms]
    for i, exp in enumerate(plan.experiments):
        for k, name in enumerate(exp.arms or []):
            if name not in arm_names:
                out.append(Problem(("experiments", i, "arms", k), f"no arm named {name!r} (arms: "
                                   f"{', '.join(arm_names) or 'none'})"))
    out += _matrix_shape(plan) + _conflicts(plan) + _param_names(plan)
    total = count_runs(plan)
    if total > MAX_RUNS:
        out.append(Problem(("matrix",), f"the plan expands to {total} runs, more than {MAX_RUNS}"))
    return out


# ------------------------------------------------------------------ one resolved run

def _role(roles: list[str], value: str, path: Path, out: list[Problem]) -> None:
    if value not in roles:
        out.append(Problem(path, f"unknown role {value!r} (roles: {', '.join(roles)})"))


def _link(roles: list[str], host: str, toward: str, path: Path, out: list[Problem]) -> None:
    _role(roles, host, path + ("host",), out)
    _role(roles, toward, path + ("toward",), out)
    if host == toward:
        out.append(Problem(path + ("toward",), "an interface cannot face its own host"))


def _hosts(t: RunTemplate, roles: list[str], out: list[Problem]) -> None:
    for role, settings in t.hosts.items():
        if role != ALL_HOSTS and role not in roles:
            out.append(Problem(("hosts", role), f"unknown role {role!r} (roles: {', '.join(roles)}, or "
                               f"{ALL_HOSTS!r})", at_key=True))
        for toward, stages in settings.qdiscs.items():
            path: Path = ("hosts", role, "qdiscs", toward)
            if role == ALL_HOSTS:
                out.append(Problem(path, "qdisc chains belong to one interface; set them under a role",
                                   at_key=True))
                continue
            if toward not in roles:
                out.append(Problem(path, f"unknown role {toward!r} (roles: {', '.join(roles)})", at_key=True))
            elif toward == role:
                out.append(Problem(path, "an interface cannot face its own host", at_key=True))
            b = t.bottleneck
            if b is not None and (b.at.host, b.at.toward) == (role, toward):
                out.append(Problem(path, "this interface carries the bottleneck, which sets its qdiscs",
                                   at_key=True))
            for k, st in enumerate(stages):
                if isinstance(st, HtbStage) and st.burst and st.burst.value < wire_frame_bytes(t.mtu.value):
                    out.append(Problem(path + (k, "burst"), "htb burst is smaller than one frame"))


def _flows(t: RunTemplate, roles: list[str], out: list[Problem]) -> None:
    tr, run_ns = t.traffic, t.duration.value
    for k in tr.per_flow:
        if k >= tr.flows:
            out.append(Problem(("traffic", "per_flow", k), f"flow {k} does not exist: there are {tr.flows} "
                               "flows (indices from 0)", at_key=True))
    ports: dict[int, int] = {}
    for f in flow_plans(tr):
        _role(roles, f.src, f.src_path, out)
        _role(roles, f.dst, f.dst_path, out)
        if f.src == f.dst:
            out.append(Problem(f.dst_path, f"flow {f.index} sends from {f.src!r} to itself"))
        if f.start_ns >= run_ns:
            out.append(Problem(f.start_path, f"flow {f.index} starts at {format_time_ns(f.start_ns)}, "
                               f"not before the run ends ({format_time_ns(run_ns)})"))
        elif f.duration_ns is not None and f.start_ns + f.duration_ns > run_ns:
            out.append(Problem(f.duration_path, f"flow {f.index} would end at "
                               f"{format_time_ns(f.start_ns + f.duration_ns)}, after the run ends at "
                               f"{format_time_ns(run_ns)} (flow longer than the run)"))
        if f.port > 65535:
            out.append(Problem(f.port_path, f"flow {f.index} would listen on port {f.port} (> 65535)"))
        elif f.port in ports:
            out.append(Problem(f.port_path, f"flows {ports[f.port]} and {f.index} share port {f.port}"))
        ports.setdefault(f.port, f.index)


def _red(q: RedQueue, rate: int, mtu: int, out: list[Problem]) -> None:
    path: Path = ("bottleneck", "queue")
    if q.mode == "ramp" and q.max is None:
        out.append(Problem(path, "a RED ramp needs `max` (above `min`)"))
    elif q.mode == "ramp" and q.max is not None and q.max.value <= q.min.value:
        out.append(Problem(path + ("max",), f"RED max ({q.max.raw}) must be above min ({q.min.raw})"))
    elif q.mode == "step" and q.max is not None:
        out.append(Problem(path + ("max",), "a step has one threshold, `min` (K); max is set to K + 1 byte"))
    r = red_bytes(q, rate, mtu)
    if q.mode == "ramp" and q.max is not None and q.max.value > q.min.value and r.max_bytes <= r.min_bytes:
        out.append(Problem(path + ("max",), f"at {format_rate(rate)} min and max both come to {r.min_bytes} B"))
    if r.limit_bytes < r.max_bytes:
        out.append(Problem(path + ("limit",), f"the buffer ({r.limit_bytes} B at {format_rate(rate)}) is "
                           f"smaller than the upper threshold ({r.max_bytes} B)"))


def _bottleneck(t: RunTemplate, roles: list[str], out: list[Problem]) -> None:
    b, mtu = t.bottleneck, t.mtu.value
    if b is None:
        return
    _link(roles, b.at.host, b.at.toward, ("bottleneck", "at"), out)
    if b.burst is not None and b.burst.value < wire_frame_bytes(mtu):
        out.append(Problem(("bottleneck", "burst"), f"htb burst {b.burst.value} B is smaller than one "
                           f"frame ({wire_frame_bytes(mtu)} B): the shaper could not send a full packet"))
    if isinstance(b.queue, RedQueue):
        _red(b.queue, b.rate.value, mtu, out)
    if b.line_rate is not None and b.line_rate.value <= b.rate.value:
        out.append(Problem(("bottleneck", "line_rate"), "the interface is not faster than the bottleneck "
                           "rate: the NIC, not the qdisc, would shape (EXPERIMENTS.md G-NIC)"))
    if b.delay is None and b.netem_limit is not None:
        out.append(Problem(("bottleneck", "netem_limit"), "netem_limit without a delay has no netem to size"))
    if b.delay is not None and b.netem_limit is None and b.line_rate is None:
        out.append(Problem(("bottleneck", "delay"), "state line_rate (the interface speed netem sees) or an "
                           "explicit netem_limit, so netem cannot drop packets silently (G-NETEM)"))


def run_problems(t: RunTemplate, roles: list[str]) -> list[Problem]:
    """Rules of one resolved run; paths are relative to the run document."""
    out: list[Problem] = []
    mtu = t.mtu.value
    if not 68 <= mtu <= 65535:
        out.append(Problem(("mtu",), f"MTU {mtu} is outside 68..65535"))
    _bottleneck(t, roles, out)
    _hosts(t, roles, out)
    _flows(t, roles, out)
    seen: dict[tuple[str, str], int] = {}
    for i, c in enumerate(t.captures):
        _link(roles, c.host, c.toward, ("captures", i), out)
        if not 96 <= c.snaplen.value <= 65535:
            out.append(Problem(("captures", i, "snaplen"), "snaplen must be 96..65535 bytes (96 keeps the "
                               "Ethernet, IP and TCP headers with options)"))
        if (c.host, c.toward) in seen:
            out.append(Problem(("captures", i), f"same interface as captures[{seen[(c.host, c.toward)]}]"))
        seen.setdefault((c.host, c.toward), i)
    if t.qdisc_stats is not None:
        for i, ln in enumerate(t.qdisc_stats.links):
            _link(roles, ln.host, ln.toward, ("qdisc_stats", "links", i), out)
        if t.qdisc_stats.interval.value % 10**6:
            out.append(Problem(("qdisc_stats", "interval"), "the polling interval must be whole milliseconds"))
    return out
