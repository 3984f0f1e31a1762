"""The local trust model's decisions (core/jobs/access.py): pure functions of who acts on whose work."""

from __future__ import annotations

import os

import pytest

from fsched.core.jobs.access import (
    Actor,
    admin_reason,
    default_tenant,
    local_actor,
    may_act_as,
    may_administer,
    may_touch_job,
    visible_tenant,
)

ALICE = Actor("alice", admin=False)
ROOT = Actor("root", admin=True, why_admin="root")


def test_who_is_an_admin():
    assert admin_reason(0, set(), None, None) == "root"
    assert admin_reason(1001, {1001}, 1001, None) == "owner of the database file"
    assert admin_reason(1001, {1001, 42}, 0, 42) == "member of group fsched-admin"
    assert admin_reason(1001, {1001}, 0, 42) is None  # neither owner nor in the group
    assert admin_reason(1001, {1001}, None, None) is None  # PostgreSQL: no file, no group
    with pytest.raises(ValueError):
        Actor("x", admin=True)  # an admin always says why


def test_a_user_acts_as_their_own_tenant_only():
    assert may_act_as(ALICE, "alice") is None
    refusal = may_act_as(ALICE, "bob")
    assert refusal.startswith("you are OS user 'alice' and may submit only as tenant 'alice', not 'bob'")
    assert "root, the owner of the SQLite file, or a member of group fsched-admin" in refusal
    assert may_act_as(ROOT, "bob") is None


def test_default_tenant_is_the_os_user_not_the_environment():
    assert default_tenant(ALICE, login_name="bob") == "alice"  # $USER=bob changes nothing
    assert default_tenant(ROOT, login_name="tester") == "tester"  # an admin keeps $USER's name


def test_jobs_of_other_tenants_are_refused_with_the_reason():
    assert may_touch_job(ALICE, "cancel", 7, "alice") is None
    assert may_touch_job(ROOT, "cancel", 7, "bob") is None
    refusal = may_touch_job(ALICE, "read the results of", 7, "bob")
    assert refusal.startswith(
        "job 7 belongs to tenant 'bob'; as OS user 'alice' you may read the results of only the jobs "
        "of tenant 'alice' (an fsched admin may read the results of any: root,"
    )


def test_listings_show_a_user_their_own_jobs():
    assert visible_tenant(ALICE, None) == ("alice", None)
    assert visible_tenant(ALICE, "alice") == ("alice", None)
    shown, refusal = visible_tenant(ALICE, "bob")
    assert shown is None and "may list only the jobs of tenant 'alice', not 'bob'" in refusal
    assert visible_tenant(ROOT, None) == (None, None)  # an admin: every job
    assert visible_tenant(ROOT, "bob") == ("bob", None)


def test_weights_and_tenants_are_for_admins():
    assert may_administer(ROOT, "changing a weight") is None
    assert may_administer(ALICE, "changing a weight") == (
        "changing a weight needs an fsched admin (root, the owner of the SQLite file, or a member of "
        "group fsched-admin); you are OS user 'alice'"
    )


def test_local_actor_reads_the_process_identity(monkeypatch):
    import pwd

    monkeypatch.setenv("USER", "somebody-else")  # the environment is not the identity
    actor = local_actor(db_owner_uid=None)
    assert actor.user == pwd.getpwuid(os.geteuid()).pw_name
    if os.geteuid() == 0:
        assert actor.why_admin == "root"
    else:
        assert local_actor(db_owner_uid=os.geteuid()).admin
