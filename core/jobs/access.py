"""Who may act on whose work: the local trust model, as pure decisions.

On one machine the OS user is the tenant. A command runs as the OS user of
its process (the effective uid, never $USER, which anyone can set): it may
submit only as the tenant of that name, and cancel, read the results of, or
list the jobs of that tenant only. An fsched admin may do all of it for any
tenant and alone may change tenants and weights. Admins are root, the owner
of the SQLite file (who can rewrite it anyway), and members of the OS group
`fsched-admin`.

What this is and is not: on SQLite every user of a shared queue can write
the database file, so these checks keep honest users to their own work and
make the rules visible; the boundary against a user who bypasses fsched is
the file's permissions (docs/deployment.md, "Access and trust"). The decisions below are
pure; `local_actor` is the one place that asks the OS who is acting.
"""

from __future__ import annotations

import grp
import os
import pwd
from dataclasses import dataclass

ADMIN_GROUP = "fsched-admin"
WHO_IS_ADMIN = f"root, the owner of the SQLite file, or a member of group {ADMIN_GROUP}"


@dataclass(slots=True, frozen=True)
class Actor:
    """The identity a command acts with."""

    user: str  # the OS user name of the process's effective uid
    admin: bool
    why_admin: str | None = None  # "root", "owner of the database file", "member of group fsched-admin"

    def __post_init__(self) -> None:
        if self.admin != (self.why_admin is not None):
            raise ValueError("an admin has a reason, and only an admin")


def admin_reason(
    uid: int, group_ids: set[int], db_owner_uid: int | None, admin_gid: int | None
) -> str | None:
    """Why `uid` is an fsched admin of this job table, or None if it is not."""
    if uid == 0:
        return "root"
    if db_owner_uid is not None and uid == db_owner_uid:
        return "owner of the database file"
    if admin_gid is not None and admin_gid in group_ids:
        return f"member of group {ADMIN_GROUP}"
    return None


def local_actor(db_owner_uid: int | None) -> Actor:
    """This process's identity, from the OS (the one impure function here)."""
    uid = os.geteuid()
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:  # a uid without a passwd entry (a bare container): still one identity
        user = f"uid-{uid}"
    try:
        admin_gid = grp.getgrnam(ADMIN_GROUP).gr_gid
    except KeyError:
        admin_gid = None
    why = admin_reason(uid, {os.getegid(), *os.getgroups()}, db_owner_uid, admin_gid)
    return Actor(user=user, admin=why is not None, why_admin=why)


def default_tenant(actor: Actor, login_name: str) -> str:
    """The tenant when --tenant is not given: the OS user; an admin's login name ($USER) as before."""
    return login_name if actor.admin else actor.user


def may_act_as(actor: Actor, tenant: str) -> str | None:
    """May `actor` submit as `tenant`? None if so, else why not."""
    if actor.admin or tenant == actor.user:
        return None
    return (
        f"you are OS user {actor.user!r} and may submit only as tenant {actor.user!r}, "
        f"not {tenant!r} (only an fsched admin may name another tenant: {WHO_IS_ADMIN})"
    )


def may_touch_job(actor: Actor, verb: str, job_id: int, tenant: str) -> str | None:
    """May `actor` `verb` ("cancel", "read the results of", "see") job `job_id` of `tenant`?"""
    if actor.admin or tenant == actor.user:
        return None
    return (
        f"job {job_id} belongs to tenant {tenant!r}; as OS user {actor.user!r} you may {verb} "
        f"only the jobs of tenant {actor.user!r} (an fsched admin may {verb} any: {WHO_IS_ADMIN})"
    )


def visible_tenant(actor: Actor, asked: str | None) -> tuple[str | None, str | None]:
    """Whose jobs a listing shows: (tenant filter, None), or (None, why not).

    A non-admin sees their own jobs only; other tenants appear as aggregate
    figures (weight, share, queued and running counts), never as jobs.
    """
    if actor.admin:
        return asked, None
    if asked is None or asked == actor.user:
        return actor.user, None
    return None, (
        f"as OS user {actor.user!r} you may list only the jobs of tenant {actor.user!r}, not {asked!r} "
        f"(other tenants' totals are in the tenants table; an fsched admin sees every job: {WHO_IS_ADMIN})"
    )


def may_administer(actor: Actor, what: str) -> str | None:
    """May `actor` do `what` (change tenants or weights)? Admins only: weights are the fairness."""
    if actor.admin:
        return None
    return f"{what} needs an fsched admin ({WHO_IS_ADMIN}); you are OS user {actor.user!r}"
