"""A testbed inventory in Ansible's INI format: read through Ansible's own loader, written by the labs.

The same file serves the playbooks (which hosts to provision) and the manager (which agent plays which
role, on which interfaces). The format, documented in docs/inventory.md:

- A host's **role** is the group that lists it directly, other than `all`, `ungrouped` and `manager`
  (`[client]`, `[aqm]`, `[server]`). Groups made only of other groups (`[testbed:children]`) are not roles,
  so Ansible's own grouping stays free; hosts only in `[manager]` run no agent and are skipped.
- Per host: `agent_url`, `data_ifaces` (a mapping keyed by the role each interface faces:
  `{"aqm": {"dev": "enp1s0f0", "addr": "198.51.100.1/24", "peer": "198.51.100.254", "mac": "…"}}`),
  optional `allow_sysctl` / `allow_module` (list or comma-separated), `tcplab_namespace` (labs only).
- Testbed-wide, usually in `[all:vars]`: `tcplab_token_file`, optional `tcplab_kind` (default
  `physical`), `tcplab_tls_ca`, `tcplab_tls_client_cert`, `tcplab_tls_client_key`.

Everything Ansible merges (host line, group vars, `[all:vars]`, host_vars/) counts. The mapping from
merged host vars to an `Inventory` is pure (`inventory_from_hosts`); only `load_ini_inventory` touches
files and Ansible. The labs' own bookkeeping (supervisor pid, processes, VM details) stays in their
inventory.json: the INI holds what the manager reads, so `without_lab_bookkeeping()` is what a round trip preserves.
"""
from __future__ import annotations

import ast
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from orchestrator.inventory import InterfaceEntry, Inventory, InventoryError

NOT_ROLES = frozenset({"all", "ungrouped", "manager"})
HOST_VARS = ("agent_url", "data_ifaces", "allow_sysctl", "allow_module", "tcplab_namespace", "tcplab_agent_listen",
             "tcplab_agent_netns")
# Ansible's connection variables a host may carry: the playbooks reach it with them
SSH_VARS = ("ansible_host", "ansible_port", "ansible_user", "ansible_ssh_private_key_file", "ansible_ssh_common_args")
# testbed-wide variable -> Inventory field
TESTBED_VARS = {"tcplab_token_file": "token_file", "tcplab_kind": "kind", "tcplab_tls_ca": "tls_ca",
                "tcplab_tls_client_cert": "tls_client_cert", "tcplab_tls_client_key": "tls_client_key",
                "tcplab_shared_clock": "shared_clock"}
# InterfaceEntry fields that data_ifaces spells differently (the key, dev, addr/plen, peer); every other
# field (mac, and any optional one the model gains) is written under its own name, so none is lost
_RESHAPED = ("toward", "addr", "plen", "peer_addr")
IFACE_EXTRA = tuple(f for f in InterfaceEntry.model_fields if f not in _RESHAPED)
IFACE_KEYS = ("dev", "addr", "peer", *IFACE_EXTRA)
_PEER_REQUIRED = InterfaceEntry.model_fields["peer_addr"].is_required()
# what only a lab's inventory.json keeps: the manager does not read it
LAB_BOOKKEEPING = ("prefix", "supervisor_pid", "processes", "vm", "uml", "topology")
DEFAULT_KIND = "physical"


class IniVarError(Exception):
    """One variable of one host that does not fit; the loader adds the file and line."""

    def __init__(self, host: str, var: str | None, msg: str) -> None:
        super().__init__(msg)
        self.host, self.var, self.msg = host, var, msg


@dataclass(frozen=True)
class IniHost:
    """One host as Ansible sees it: the groups that list it directly, and its merged variables."""
    name: str
    groups: tuple[str, ...]
    vars: dict[str, Any]


# ---- Ansible's view -> Inventory (pure) ----

def inventory_from_hosts(hosts: list[IniHost]) -> Inventory:
    """Map Ansible's hosts to the manager's Inventory; raises IniVarError naming host and variable."""
    by_role: dict[str, IniHost] = {}
    for host in hosts:
        roles = [g for g in host.groups if g not in NOT_ROLES]
        if not roles:
            if "manager" in host.groups:
                continue                  # the manager runs no agent
            raise IniVarError(host.name, None, "in no role group: list it under [client], [aqm], [server] or "
                              "another role of the plan")
        if len(roles) > 1:
            raise IniVarError(host.name, None, f"listed directly in several role groups {roles}: a host plays "
                              "one role (put other groupings in a [group:children] section)")
        if roles[0] in by_role:
            raise IniVarError(host.name, None, f"role {roles[0]!r} is already played by {by_role[roles[0]].name}:"
                              " one host per role")
        by_role[roles[0]] = host
    if not by_role:
        raise IniVarError("(none)", None, "no host in a role group")
    doc: dict[str, Any] = {"hosts": {role: _host_entry(host) for role, host in by_role.items()}}
    doc.update(_testbed_vars(list(by_role.values())))
    doc.setdefault("kind", DEFAULT_KIND)
    try:
        return Inventory.model_validate(doc)
    except ValidationError as exc:      # what the per-variable checks let through (e.g. a non-integer plen)
        raise IniVarError(", ".join(h.name for h in by_role.values()), None, str(exc)) from None


def _host_entry(host: IniHost) -> dict[str, Any]:
    v = host.vars
    unknown = sorted(k for k in v if k.startswith("tcplab_") and k not in HOST_VARS and k not in TESTBED_VARS)
    if unknown:
        raise IniVarError(host.name, unknown[0], f"unknown variable (tcplab variables: "
                          f"{', '.join(sorted((*TESTBED_VARS, *(h for h in HOST_VARS if 'tcplab' in h))))})")
    for required in ("agent_url", "data_ifaces"):
        if required not in v:
            raise IniVarError(host.name, required, "missing")
    agent = _text(host, "agent_url", v["agent_url"])
    if not re.match(r"^(tcp://\S+:\d+|unix:/\S+)$", agent):
        raise IniVarError(host.name, "agent_url", f"{agent!r} is neither tcp://HOST:PORT nor unix:/PATH")
    entry: dict[str, Any] = {"agent": agent, "interfaces": _interfaces(host, v["data_ifaces"])}
    if "tcplab_namespace" in v:
        entry["namespace"] = _text(host, "tcplab_namespace", v["tcplab_namespace"])
    if "tcplab_agent_listen" in v:
        entry["agent_listen"] = _text(host, "tcplab_agent_listen", v["tcplab_agent_listen"])
    if "tcplab_agent_netns" in v:
        entry["agent_netns"] = _text(host, "tcplab_agent_netns", v["tcplab_agent_netns"])
    ssh = {k: str(v[k]) for k in SSH_VARS if k in v}
    if ssh:
        entry["ssh"] = ssh
    for var in ("allow_sysctl", "allow_module"):
        if var in v:
            entry[var] = _names(host, var, v[var])
    return entry


def _interfaces(host: IniHost, raw: Any) -> dict[str, dict[str, Any]]:
    """`data_ifaces` (role faced -> dev, addr/plen, peer, mac) -> the model's interfaces keyed by name."""
    if isinstance(raw, str):            # a [group:vars] section keeps values as text: accept JSON there
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            raise IniVarError(host.name, "data_ifaces", 'not a mapping: write {"ROLE": {"dev": …, "addr": '
                              '"A.B.C.D/PLEN", "peer": …, "mac": …}} on the host line') from None
    if not isinstance(raw, dict) or not raw:
        raise IniVarError(host.name, "data_ifaces", "must be a non-empty mapping from the role faced to "
                          "the interface")
    out: dict[str, dict[str, Any]] = {}
    for toward, spec in raw.items():
        where = f"data_ifaces.{toward}"
        if not isinstance(spec, dict):
            raise IniVarError(host.name, where, f"must be a mapping with {', '.join(IFACE_KEYS)}")
        unknown = sorted(set(spec) - set(IFACE_KEYS))
        if unknown:
            raise IniVarError(host.name, f"{where}.{unknown[0]}", f"unknown key (expected: {', '.join(IFACE_KEYS)})")
        for key in ("dev", "addr", "peer") if _PEER_REQUIRED else ("dev", "addr"):
            if key not in spec:
                raise IniVarError(host.name, f"{where}.{key}", "missing")
        addr, _, plen = str(spec["addr"]).partition("/")
        if not plen.isdigit():
            raise IniVarError(host.name, f"{where}.addr", f"{spec['addr']!r} has no prefix length (ADDRESS/PLEN)")
        dev = str(spec["dev"])
        if dev in out:
            raise IniVarError(host.name, f"{where}.dev", f"{dev} already faces {out[dev]['toward']}")
        out[dev] = {"toward": str(toward), "addr": addr, "plen": int(plen),
                    **({"peer_addr": str(spec["peer"])} if "peer" in spec else {}),
                    **{k: spec[k] for k in IFACE_EXTRA if k in spec}}
    return out


def _testbed_vars(hosts: list[IniHost]) -> dict[str, Any]:
    """Testbed-wide variables: every agent host must see the same value (they are one testbed)."""
    out: dict[str, Any] = {}
    seen: dict[str, str] = {}
    for var, field in TESTBED_VARS.items():
        for host in hosts:
            if var not in host.vars:
                continue
            value = _text(host, var, host.vars[var])
            if field in out and out[field] != value:
                raise IniVarError(host.name, var, f"{value!r} differs from {out[field]!r} on {seen[field]}: "
                                  "set it once, in [all:vars]")
            out[field], seen[field] = value, host.name
    if "token_file" not in out:
        raise IniVarError(hosts[0].name, "tcplab_token_file", "missing (set it in [all:vars])")
    return out


def _text(host: IniHost, var: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise IniVarError(host.name, var, f"must be a non-empty string, not {value!r}")
    return str(value)


def _names(host: IniHost, var: str, value: Any) -> list[str]:
    if isinstance(value, str):
        return [p.strip() for p in value.split(",") if p.strip()]
    if isinstance(value, list) and all(isinstance(p, str) for p in value):
        return [str(p) for p in value]
    raise IniVarError(host.name, var, f"must be a list of names or a comma-separated string, not {value!r}")


def without_lab_bookkeeping(inv: Inventory) -> Inventory:
    """What an INI inventory carries: the inventory without the labs' bookkeeping."""
    fields = Inventory.model_fields
    return inv.model_copy(update={f: fields[f].get_default(call_default_factory=True)
                                  for f in LAB_BOOKKEEPING if f in fields})


# ---- Inventory -> INI text (pure) ----

def to_ini(inv: Inventory) -> str:
    """The INI form of `inv` (without the labs' bookkeeping), loadable by Ansible and `load_ini_inventory`."""
    clash = sorted(NOT_ROLES & set(inv.hosts))
    if clash:
        raise ValueError(f"role {clash[0]!r} cannot be an INI role group (reserved: {', '.join(sorted(NOT_ROLES))})")
    lines = [f"# tcplab testbed inventory ({inv.kind}); the format: docs/inventory.md", ""]
    for role, host in inv.hosts.items():
        name = host.namespace or f"{inv.prefix or 'tcplab'}-{role}"
        ifaces = {i.toward: _iface_spec(dev, i) for dev, i in host.interfaces.items()}
        hv: dict[str, Any] = {"agent_url": host.agent, "data_ifaces": ifaces}
        if host.namespace:
            hv["tcplab_namespace"] = host.namespace
        if host.agent_listen:
            hv["tcplab_agent_listen"] = host.agent_listen
        if host.agent_netns:
            hv["tcplab_agent_netns"] = host.agent_netns
        hv.update(host.ssh or {})
        for var in ("allow_sysctl", "allow_module"):
            if getattr(host, var):
                hv[var] = getattr(host, var)
        lines += [f"[{role}]", " ".join([name, *(f"{k}={_host_value(v)}" for k, v in hv.items())]), ""]
    lines.append("[all:vars]")
    for var, field in TESTBED_VARS.items():
        value = getattr(inv, field)
        if value not in (None, False):
            # a [group:vars] value is taken as text up to the end of the line, so it needs no quoting
            lines.append(f"{var}={value}")
    return "\n".join(lines) + "\n"


def _iface_spec(dev: str, iface: InterfaceEntry) -> dict[str, Any]:
    """One data_ifaces entry; fields at their default are left out (an absent key reads back as the default)."""
    spec: dict[str, Any] = {"dev": dev, "addr": f"{iface.addr}/{iface.plen}"}
    if iface.peer_addr or _PEER_REQUIRED:
        spec["peer"] = iface.peer_addr
    for field in IFACE_EXTRA:
        value = getattr(iface, field)
        if value != InterfaceEntry.model_fields[field].get_default(call_default_factory=True):
            spec[field] = value
    return spec


def _host_value(value: Any) -> str:
    """A host-line value Ansible reads back as `value`: it shell-splits the line, then tries
    ast.literal_eval on each value, so a string that would evaluate to something else is written quoted."""
    if isinstance(value, str):
        try:
            ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return shlex.quote(value)
    return shlex.quote(json.dumps(value))


# ---- effects: Ansible reads the file ----

def load_ini_inventory(path: Path) -> Inventory:
    """Read `path` with Ansible's InventoryManager/VariableManager and map it; errors name FILE:LINE, host, var."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: no inventory")
    path = path.resolve()
    hosts = ansible_hosts(path)
    try:
        return inventory_from_hosts(hosts)
    except IniVarError as exc:
        line = _line_of(path, exc.host, exc.var)
        var = f" {exc.var}:" if exc.var else ""
        raise InventoryError(f"{path}{f':{line}' if line else ''}: host {exc.host}:{var} {exc.msg}") from None


def ansible_hosts(path: Path) -> list[IniHost]:
    """Every host of an INI inventory as Ansible's own loader sees it (groups that list it, merged vars)."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    manager = InventoryManager(loader=loader, sources=[str(path)])
    if not manager.hosts:
        raise InventoryError(f"{path}: {_ansible_parse_error(loader, path)}")
    variables = VariableManager(loader=loader, inventory=manager)
    direct = {h.name: tuple(g.name for g in manager.groups.values() if h in g.hosts)
              for h in manager.hosts.values()}
    return [IniHost(h.name, direct[h.name], _plain(variables.get_vars(host=h))) for h in manager.hosts.values()]


def host_roles(hosts: list[IniHost]) -> dict[str, str]:
    """Inventory host name -> role (the one role group that lists it; the manager's hosts have none)."""
    return {h.name: roles[0] for h in hosts if (roles := [g for g in h.groups if g not in NOT_ROLES])}


def _ansible_parse_error(loader: Any, path: Path) -> str:
    """Why Ansible parsed nothing: its INI plugin's own message (the manager only warns on stderr)."""
    from ansible.inventory.data import InventoryData
    from ansible.plugins.loader import inventory_loader

    try:
        inventory_loader.get("ini").parse(InventoryData(), loader, str(path))
    except Exception as exc:  # noqa: BLE001 - Ansible's parser errors have no common public base here
        return f"Ansible cannot read it as an INI inventory: {exc}"
    return "no hosts in it"


def _line_of(path: Path, host: str, var: str | None) -> int | None:
    """1-based line of `var` on `host`'s line, else of the `var=` in a vars section, else of the host line.
    Only recent Ansible (2.19) tags values with their origin and ansible-core>=2.16 is allowed, so the file is
    searched: the same answer on every release."""
    lines = path.read_text().splitlines()
    top = var.split(".")[0] if var else None
    host_line = next((n for n, text in enumerate(lines, 1) if text.split(maxsplit=1)[:1] == [host]), None)
    if top and host_line and re.search(rf"(^|\s){re.escape(top)}=", lines[host_line - 1]):
        return host_line
    if top:
        hit = next((n for n, text in enumerate(lines, 1) if text.strip().startswith(f"{top}=")), None)
        if hit:
            return hit
    return host_line


def _plain(value: Any) -> Any:
    """Ansible's tagged str/int/dict/list subclasses as plain Python values."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    return value
