"""``ckpt_grant_select_like`` (migration 0014): the grant every migration that adds a readable
table makes, once: whoever may read the source table may read the new one (the roles holding
SELECT on it, or PUBLIC), the owner excepted."""

from __future__ import annotations

import uuid

import psycopg


def _grantees(admin: psycopg.Connection, table: str) -> list[tuple[str]]:
    return admin.execute(
        "SELECT DISTINCT CASE a.grantee WHEN 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END"
        " FROM pg_class c, aclexplode(c.relacl) a"
        " WHERE c.oid = %s::regclass AND a.privilege_type = 'SELECT' AND a.grantee <> c.relowner",
        (table,),
    ).fetchall()


def test_the_readers_of_the_source_may_read_the_target(database_url: str) -> None:
    role = f"reader_{uuid.uuid4().hex[:8]}"
    tables = [f"t_{uuid.uuid4().hex[:8]}" for _ in range(4)]
    source, target, open_source, open_target = tables
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role}")
        try:
            for table in tables:
                admin.execute(f"CREATE TABLE {table} (x int)")
            # GIVEN a source one role may read, and one that PUBLIC may read
            admin.execute(f"GRANT SELECT ON {source} TO {role}")
            admin.execute(f"GRANT SELECT ON {open_source} TO PUBLIC")
            # WHEN each grant is copied to a new table
            admin.execute("SELECT ckpt_grant_select_like(%s, %s)", (source, target))
            admin.execute("SELECT ckpt_grant_select_like(%s, %s)", (open_source, open_target))
            # THEN the new tables have exactly the sources' readers
            assert _grantees(admin, target) == [(role,)]
            assert _grantees(admin, open_target) == [("PUBLIC",)]
        finally:
            for table in tables:
                admin.execute(f"DROP TABLE IF EXISTS {table}")
            admin.execute(f"DROP ROLE {role}")
