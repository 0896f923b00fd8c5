"""Strings that reach a root agent's argv or a kernel file, typed at the protocol boundary.

`ip neigh replace help ...` makes ip parse `help` as a keyword, a NUL cannot be passed in argv at all, a lone
surrogate (a JSON frame may carry `\\ud800`) cannot be encoded to write a file: each of those once reached the
agent's catch-all as `failed` with a Python exception. Every such value is refused here instead, as
`invalid_args` naming the field. Addresses are checked with `ipaddress`, never a list of keywords; a pattern
on a string also refuses lone surrogates (pydantic cannot match a pattern on them).
"""
from __future__ import annotations

import ipaddress
from typing import Annotated

from pydantic import AfterValidator, Field

from schemas.allowlist import MAX_SYSCTL_NAME, MODULE_NAME_PATTERN, PARAM_NAME_PATTERN, SYSCTL_NAME_PATTERN

# printable text on one line: no C0 control character (NUL, newline, tab...) and no DEL
ONE_LINE = r"^[^\x00-\x1f\x7f]*$"
MAX_VALUE = 1024   # the longest sysctl value the studies write is ~30 characters (tcp_rmem triples)


def canonical_ip(text: str) -> str:
    """The address as `ip` prints it (IPv6 compressed, lower case), so read-back compares equal."""
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise ValueError(f"{text!r} is not an IPv4 or IPv6 address") from None


IPAddress = Annotated[str, Field(pattern=r"^[0-9A-Fa-f:.]{2,45}$", description="an IPv4 or IPv6 address"),
                      AfterValidator(canonical_ip)]
MacAddress = Annotated[str, Field(pattern=r"^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}$",
                                  description="an Ethernet address, aa:bb:cc:dd:ee:ff"),
                       AfterValidator(str.lower)]
# Linux: at most 15 bytes, no `/`, `:` or white space, not `.` or `..`; the labs and testbeds use letters,
# digits, `_`, `-` and `.` (VLANs: eth0.100). Never a leading `-` (an option to ethtool) or `.`.
InterfaceName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}$", description="a network interface")]
SysctlName = Annotated[str, Field(pattern=SYSCTL_NAME_PATTERN, max_length=MAX_SYSCTL_NAME,
                                  description="dotted sysctl name (sysctl(8) form: eth0.100 is written eth0/100)")]
KernelValue = Annotated[str, Field(pattern=ONE_LINE, min_length=1, max_length=MAX_VALUE,
                                   description="a value written to a kernel file: one printable line")]
ModuleName = Annotated[str, Field(pattern=MODULE_NAME_PATTERN, description="a kernel module")]
ParamName = Annotated[str, Field(pattern=PARAM_NAME_PATTERN, description="a module parameter")]
