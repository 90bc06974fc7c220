"""Stand-ins a python check's test hands the answer instead of its own objects (the driver's side; stdlib only).

A test never hands the answer one of its objects: the answer could reach its attributes, frames and globals from
there. It hands a `wire.StandIn` instead, whose members are functions the answer may only call and plain data,
while the object itself, and whatever it records, stays in the driver, outside the answer's reach.
"""

import sqlite3
import time

from minigrpo.judge.wire import StandIn

# What SQL from the answer may not do to the driver's database: reach files (ATTACH), change the engine's settings
# (PRAGMA), or load code (load_extension is off by default in Python's sqlite3, and refused here as well).
_DENIED = {sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH, sqlite3.SQLITE_PRAGMA}
MAX_ROWS = 10000
STATEMENT_SECONDS = 2.0     # a statement of the answer's runs in the driver: a recursive query must not hold it


def _authorize(action, arg1, arg2, db, trigger):
    if action in _DENIED or action == sqlite3.SQLITE_FUNCTION and str(arg2).lower() == "load_extension":
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def _cursor(cur):
    """A stand-in for a sqlite3 cursor: its rows are fetched here, at most MAX_ROWS, and cross as tuples."""
    rows = iter(cur.fetchmany(MAX_ROWS))
    return StandIn(fetchone=lambda: next(rows, None), fetchall=lambda: list(rows),
                   fetchmany=lambda size=1: [row for _, row in zip(range(size), rows)],
                   rowcount=cur.rowcount, lastrowid=cur.lastrowid, description=cur.description)


def sqlite_stand_in(conn, log=None):
    """A stand-in for the sqlite3 connection `conn`, which stays in the driver: execute(sql, params=()) and
    executemany(sql, seq) run there and return a cursor stand-in (fetchone, fetchall, fetchmany, rowcount,
    lastrowid, description); commit and rollback are passed through. Each statement is appended to `log` (a list
    of the test's) as (sql, params). So the statements a check counts or the tables it inspects afterwards are
    what a database outside the answer's process executed and holds."""
    conn.set_authorizer(_authorize)
    deadline = [0.0]
    conn.set_progress_handler(lambda: time.monotonic() > deadline[0], 1000)   # non-zero: sqlite interrupts

    def timed(run):
        def call(sql, params=()):
            if log is not None:
                log.append((sql, params))
            deadline[0] = time.monotonic() + STATEMENT_SECONDS
            try:
                return _cursor(run(sql, params))
            finally:
                deadline[0] = float("inf")      # the test's own statements are not timed
        return call

    deadline[0] = float("inf")
    return StandIn(execute=timed(conn.execute), executemany=timed(conn.executemany), commit=conn.commit,
                   rollback=conn.rollback, cursor=lambda: StandIn(execute=timed(conn.execute),
                                                                  executemany=timed(conn.executemany)))
