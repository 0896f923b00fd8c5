"""The testbed inventory the manager uses: roles -> agent endpoints and data interfaces.

The netns and VM labs write it (`/run/tcplab/inventory.json`, and the same as Ansible INI next to it); a
physical testbed provides the same shape, usually as Ansible's `inventory.ini` (orchestrator/inventory_ini.py).
Every model refuses keys it does not know: a typo in a hand-written inventory (`tovard:` for `toward:`)
must stop the run with the file, the field path and the line, not pass silently with a default.
"""
from __future__ import annotations

import json
import ssl
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError


class InventoryError(ValueError):
    """An inventory file that cannot be read or does not fit the models; the message names file, field, line."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# the labs tcplab builds on one machine (orchestrator/lab): the manager shares their CPUs, their topology is
# rebuilt with `lab up --plan`, and their runs are tagged smoke (G-VM)
LAB_KINDS = ("netns", "vm", "uml")


class InterfaceEntry(_Strict):
    toward: str
    addr: str
    plen: int
    peer_addr: str = Field("", description="the peer's address on a point-to-point link (empty on a switch)")
    mac: str = ""
    # an interface facing a switch (`toward` names the switch) reaches every host on it directly
    switch_peers: dict[str, str] = Field(default_factory=dict, description="role -> address of the hosts "
                                         "behind the switch this interface faces")

    def reaches(self, role: str) -> bool:
        return self.toward == role or role in self.switch_peers

    @property
    def peer_addrs(self) -> list[str]:
        return list(self.switch_peers.values()) or [self.peer_addr]


class HostEntry(_Strict):
    agent: str
    namespace: str | None = None
    interfaces: dict[str, InterfaceEntry]
    # what the testbed lets a plan make this agent write (its --allow-sysctl / --allow-module; empty: the
    # defaults of schemas/allowlist.py); the labs' supervisor starts the agents with them
    allow_sysctl: list[str] = Field(default_factory=list, description="sysctl prefixes the agent may write")
    allow_module: list[str] = Field(default_factory=list, description="modules the agent may load and configure")
    # how Ansible reaches the host (playbooks/site.yml, kernel-install.yml): its connection variables
    ssh: dict[str, str] | None = Field(None, description="Ansible connection variables (ansible_host, ansible_port, "
                                       "ansible_user, ansible_ssh_private_key_file, ansible_ssh_common_args)")
    agent_listen: str | None = Field(None, description="where the agent listens on the host, when the manager "
                                     "reaches it at another address (`agent`; e.g. through a port forward)")
    agent_netns: str | None = Field(None, description="the network namespace on the manager's machine from which "
                                    "a tcp:// agent is reached (a UML lab's control network lives only there)")

    def iface_toward(self, role: str) -> str:
        for name, entry in self.interfaces.items():
            if entry.reaches(role):
                return name
        raise KeyError(f"no interface toward {role!r} (have {sorted(self.interfaces)})")

    @property
    def data_addr(self) -> str:
        return next(iter(self.interfaces.values())).addr


class Inventory(_Strict):
    kind: str
    token_file: str
    hosts: dict[str, HostEntry]
    # TLS for tcp:// agents (docs/security.md); without tls_ca the control network must be trusted
    tls_ca: str | None = Field(None, description="PEM CA that signed the agents' certificates: the manager "
                               "speaks TLS to tcp:// agents and verifies them against it")
    tls_client_cert: str | None = Field(None, description="PEM client certificate of the manager (agents "
                                        "started with --tls-client-ca require one)")
    tls_client_key: str | None = Field(None, description="PEM private key of tls_client_cert")
    shared_clock: bool = Field(False, description="every host reads the manager's own clock (a UML lab: each "
                               "kernel reads the machine's): the measured offsets are recorded, not applied, "
                               "and no G-CLOCK can arise")
    # the labs' own bookkeeping in the same file (orchestrator/lab); the manager does not read it
    prefix: str | None = Field(None, description="lab: namespace/interface name prefix")
    supervisor_pid: int | None = Field(None, description="lab: pid of the lab supervisor")
    processes: list[dict[str, Any]] = Field(default_factory=list, description="lab: the supervisor's extra children")
    vm: dict[str, Any] | None = Field(None, description="VM lab: kernel image, guests, boot time")
    uml: dict[str, Any] | None = Field(None, description="UML lab: kernel, wire namespace, hosts, boot time")
    topology: dict[str, Any] | None = Field(None, description="lab: the hosts, switches and links it was built "
                                            "as (a plan's TopologySpec)")

    @property
    def token(self) -> bytes:
        return Path(self.token_file).read_bytes().strip()

    def tls_context(self) -> ssl.SSLContext | None:
        """The manager's TLS client context for tcp:// agents, or None when the inventory names no CA."""
        if self.tls_ca is None:
            if self.tls_client_cert:
                raise InventoryError("inventory: tls_client_cert without tls_ca: name the CA that signed the "
                                     "agents' certificates")
            return None
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.tls_ca)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.tls_client_cert:
            ctx.load_cert_chain(self.tls_client_cert, self.tls_client_key)
        return ctx

    @property
    def tags(self) -> list[str]:
        # G-VM: runs on a virtual lab never feed baselines or study tables
        return ["smoke"] if self.kind in LAB_KINDS else []


def load_inventory(path: Path) -> Inventory:
    """The inventory at `path`: Ansible's INI format for `.ini` (orchestrator/inventory_ini.py), else JSON."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: no inventory (is the lab up? run `tcplab lab up`)")
    if path.suffix == ".ini":
        from orchestrator.inventory_ini import load_ini_inventory  # imports this module; Ansible loads lazily

        return load_ini_inventory(path)
    text = path.read_text()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InventoryError(f"{path}:{exc.lineno}:{exc.colno}: not JSON: {exc.msg}") from None
    try:
        return Inventory.model_validate(doc)
    except ValidationError as exc:
        raise InventoryError(_describe(path, text, exc)) from None


def _describe(path: Path, text: str, exc: ValidationError) -> str:
    """One line per problem: `FILE:LINE: field.path: what is wrong`."""
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        where = ".".join(str(p) for p in loc) or "(top level)"
        if err["type"] == "extra_forbidden":
            model = _model_at(loc[:-1])
            known = f" (expected one of: {', '.join(sorted(model.model_fields))})" if model else ""
            what = f"unknown field {loc[-1]!r}{known}"
        else:
            what = err["msg"]
        line = _line_of(text, loc)
        lines.append(f"{path}{f':{line}' if line else ''}: {where}: {what}")
    return "inventory refused:\n  " + "\n  ".join(lines)


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The model whose field set applies at `loc` (a path of field names and dict keys)."""
    model: type[BaseModel] = Inventory
    i = 0
    while i < len(loc):
        step = {(Inventory, "hosts"): HostEntry, (HostEntry, "interfaces"): InterfaceEntry}.get((model, loc[i]))
        if step is None or i + 1 >= len(loc):
            return None
        model, i = step, i + 2        # the field name, then the dict key (role or interface name)
    return model


def _line_of(text: str, loc: tuple) -> int | None:
    """1-based line of the key (or value) at `loc`; JSON is YAML, whose parser keeps positions."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    line = None
    for step in loc:
        if isinstance(node, yaml.MappingNode):
            hit = next(((k, v) for k, v in node.value if k.value == str(step)), None)
            if hit is None:
                return line
            line, node = hit[0].start_mark.line + 1, hit[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(step, int) and step < len(node.value):
            node = node.value[step]
            line = node.start_mark.line + 1
        else:
            return line
    return line
