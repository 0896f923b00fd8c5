"""The campaign lease (effects): at most one manager runs a campaign at a time, across machines, on SQLite and
PostgreSQL alike.

A lease row names its holder (`host:pid`) and an expiry. It is taken when absent, expired, or held by a process
of this machine that no longer exists (a manager killed with SIGKILL frees its campaign at once on the machine it
ran on, and after LEASE_S everywhere else); the holder renews it while the campaign runs and deletes it at the
end. Every change is one conditional statement, so two managers racing for it cannot both win: the loser's
INSERT hits the primary key, or its UPDATE matches no row.
"""
from __future__ import annotations

import datetime as dt
import os
import socket
from dataclasses import dataclass

from sqlalchemy import Engine, and_, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from orchestrator.storage.campaign_tables import campaign_lease
from orchestrator.storage.db import writer

LEASE_S = 120.0        # renewed every LEASE_S / 4 by a running campaign


@dataclass(frozen=True)
class Holder:
    name: str
    expires_at: dt.datetime


def me() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _aware(t: dt.datetime) -> dt.datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=dt.UTC)   # SQLite returns naive UTC


def _gone(holder: str) -> bool:
    """The holder is a process of this machine that no longer runs (kill -9, a crash, a reboot)."""
    host, _, pid = holder.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def current(engine: Engine, campaign: str) -> Holder | None:
    with engine.connect() as conn:
        row = conn.execute(select(campaign_lease).where(campaign_lease.c.campaign == campaign)).first()
    return Holder(row.holder, _aware(row.expires_at)) if row else None


def acquire(engine: Engine, campaign: str, holder: str | None = None, lease_s: float = LEASE_S) -> Holder | None:
    """Take the lease; None when we hold it now, else the other holder."""
    holder = holder or me()
    now = _now()
    until = now + dt.timedelta(seconds=lease_s)
    other = current(engine, campaign)
    try:
        with writer(engine).begin() as conn:
            if other is None:
                conn.execute(insert(campaign_lease).values(campaign=campaign, holder=holder, acquired_at=now,
                                                           expires_at=until))
                return None
            free = other.name == holder or other.expires_at < now or _gone(other.name)
            if not free:
                return other
            # matches no row once another manager has taken it over from the same stale holder
            res = conn.execute(update(campaign_lease).where(and_(campaign_lease.c.campaign == campaign,
                                                                 campaign_lease.c.holder == other.name))
                               .values(holder=holder, acquired_at=now, expires_at=until))
            if res.rowcount == 1:
                return None
    except IntegrityError:
        pass   # another manager inserted first
    return current(engine, campaign) or Holder("?", now)


def renew(engine: Engine, campaign: str, holder: str | None = None, lease_s: float = LEASE_S) -> bool:
    """Extend our lease; False when it is no longer ours (taken over after it expired)."""
    holder = holder or me()
    with writer(engine).begin() as conn:
        res = conn.execute(update(campaign_lease).where(campaign_lease.c.campaign == campaign,
                                                        campaign_lease.c.holder == holder)
                           .values(expires_at=_now() + dt.timedelta(seconds=lease_s)))
    return res.rowcount == 1


def release(engine: Engine, campaign: str, holder: str | None = None) -> None:
    with writer(engine).begin() as conn:
        conn.execute(delete(campaign_lease).where(campaign_lease.c.campaign == campaign,
                                                  campaign_lease.c.holder == (holder or me())))
