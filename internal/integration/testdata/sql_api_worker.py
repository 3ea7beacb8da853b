"""A worker that holds fencelock leases through the SQL API only (migration 00014), for
sql_api_python_test.go: psycopg 3 (Debian's python3-psycopg), no fencelock client library.

Usage: python3 sql_api_worker.py DATABASE_URL

It reads one command a line on stdin and writes one reply a line on stdout, so that the Go test
awaits each step instead of sleeping:

    try NAME HOLDER TTL_MS                   fencelock.try_acquire      -> ok TOKEN | ok null
    renew NAME HOLDER TOKEN TTL_MS           fencelock.renew            -> ok
    release NAME HOLDER TOKEN                fencelock.release          -> ok true | ok false
    fence_lease NAME HOLDER TOKEN RESOURCE   a fenced write: one transaction of
                                             fencelock.fence_lease and an INSERT into writes
                                                                        -> ok
    fence RESOURCE TOKEN                     a fenced write: one transaction of
                                             fencelock.fence and an INSERT into writes
                                                                        -> ok

A refused command replies "err SQLSTATE MESSAGE" (its transaction rolled back), a malformed one
"err usage MESSAGE". The writes table is the test's: writes (resource text, token bigint).
Every statement outside the fenced writes runs in autocommit, as a transaction of its own.
"""

import sys

import psycopg


def main():
    conn = psycopg.connect(sys.argv[1], autocommit=True)
    for line in sys.stdin:
        fields = line.split()
        if not fields:
            continue
        try:
            reply = "ok" + run(conn, fields)
        except psycopg.Error as e:
            state = e.sqlstate or "none"
            reply = "err %s %s" % (state, " ".join(str(e).split()))
        except (KeyError, ValueError) as e:
            reply = "err usage %s: %s" % (fields[0], e)
        print(reply, flush=True)
    conn.close()


def run(conn, fields):
    cmd, args = fields[0], fields[1:]
    if cmd == "try":
        name, holder, ttl_ms = args
        row = conn.execute(
            "SELECT fencelock.try_acquire(%s, %s, %s * interval '1 millisecond')",
            (name, holder, int(ttl_ms))).fetchone()
        return " null" if row[0] is None else " %d" % row[0]
    if cmd == "renew":
        name, holder, token, ttl_ms = args
        conn.execute(
            "SELECT fencelock.renew(%s, %s, %s, %s * interval '1 millisecond')",
            (name, holder, int(token), int(ttl_ms)))
        return ""
    if cmd == "release":
        name, holder, token = args
        row = conn.execute("SELECT fencelock.release(%s, %s, %s)",
                           (name, holder, int(token))).fetchone()
        return " true" if row[0] else " false"
    if cmd == "fence_lease":
        name, holder, token, resource = args
        with conn.transaction():
            conn.execute("SELECT fencelock.fence_lease(%s, %s, %s, %s)",
                         (name, holder, int(token), resource))
            conn.execute("INSERT INTO writes (resource, token) VALUES (%s, %s)",
                         (resource, int(token)))
        return ""
    if cmd == "fence":
        resource, token = args
        with conn.transaction():
            conn.execute("SELECT fencelock.fence(%s, %s)", (resource, int(token)))
            conn.execute("INSERT INTO writes (resource, token) VALUES (%s, %s)",
                         (resource, int(token)))
        return ""
    raise KeyError("unknown command")


if __name__ == "__main__":
    main()
