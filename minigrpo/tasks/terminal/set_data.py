"""Terminal exercises on data: a SQLite database (through python3's sqlite3 module: the sqlite3 command is not in
every sandbox) and CSV files made into reports. A database the agent changed is read back in verify.probe's
sandbox, never opened on the host: a database file is a program of sorts (views, triggers) and an attack surface
of its own."""

import csv
import io
import json
import os
import random
import sqlite3
import tempfile

from minigrpo.tasks.terminal.exercise import Exercise, Transcript as T
from minigrpo.tasks.terminal.verify import MAX_READ, lines_are, names_only, number_is, probe

EXERCISES = []


def _add(**kw):
    EXERCISES.append(Exercise(needs=("python3",), **kw))


def _database(schema, tables):
    """The bytes of a fresh SQLite file holding `tables` ({name: rows}) under `schema`."""
    with tempfile.TemporaryDirectory(prefix="minigrpo-terminal-") as d:
        path = os.path.join(d, "db.sqlite")
        con = sqlite3.connect(path)
        try:
            with con:
                con.executescript(schema)
                for name, rows in tables.items():
                    con.executemany(f"insert into {name} values ({', '.join('?' * len(rows[0]))})", rows)
        finally:
            con.close()
        with open(path, "rb") as f:
            return f.read()


_READER = """import json
import sqlite3
try:
    con = sqlite3.connect(DB)
    print(json.dumps(con.execute(QUERY).fetchall()))
except Exception as e:
    print(json.dumps({"error": type(e).__name__}))
"""


def _rows(folder, db, query):
    """The rows of `query` on the agent's database file `db` (and its journal), read in the probe's sandbox by
    python3 -I (no module of the agent's on its path); None when that fails."""
    script = _READER.replace("DB", repr(db)).replace("QUERY", repr(query))
    r = probe(folder, "python3 -I _probe.py", take=lambda rel: rel in (db, db + "-journal", db + "-wal"),
              extra={"_probe.py": script})
    lines = r.output.strip().splitlines()
    try:
        got = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return got if isinstance(got, list) else None


# --- a shop: customers and orders ----------------------------------------------------------------------------------

def _shop():
    rng = random.Random(11)
    plan = {"ana": (5, 18, 30), "ben": (9, 3, 8), "cai": (3, 55, 70), "dave": (4, 10, 20), "eve": (2, 5, 15)}
    customers = [(i + 1, name) for i, name in enumerate(plan)]
    orders = [[cid, f"2024-{rng.randint(1, 4):02d}-{rng.randint(1, 28):02d}", rng.randint(1, 3),
               round(rng.uniform(*plan[name][1:]), 2), "paid"] for cid, name in customers for _ in range(plan[name][0])]
    rng.shuffle(orders)
    return customers, [(i + 1, *o) for i, o in enumerate(orders)]


_CUSTOMERS, _ORDERS = _shop()
_SCHEMA = ("create table customers (id integer primary key, name text not null);\n"
           "create table orders (id integer primary key, customer_id integer references customers(id), day text, "
           "quantity integer, price real, status text);\n")
_SHOP = _database(_SCHEMA, {"customers": _CUSTOMERS, "orders": _ORDERS})
_NAME = dict(_CUSTOMERS)
_MARCH = round(sum(q * p for _, _, day, q, p, _ in _ORDERS if day.startswith("2024-03")), 2)
_SPENT = {n: sum(q * p for _, c, _, q, p, _ in _ORDERS if _NAME[c] == n) for n in _NAME.values()}
_MOST_ORDERS = max(_NAME.values(), key=lambda n: sum(_NAME[o[1]] == n for o in _ORDERS))
_PY = "python3 - <<'EOF'\nimport sqlite3\ncon = sqlite3.connect('shop.db')\n{}\nEOF"

_add(id="sqlite-march-revenue", category="sqlite",
     instruction="shop.db is a SQLite database (python3's sqlite3 module can read it). What was the total revenue "
                 "of the orders placed in March 2024, summing quantity times price? Finish your answer with the "
                 "number, rounded to two decimals.",
     files={"shop.db": _SHOP}, verify=lambda f, a: number_is(a, _MARCH, tol=0.006),
     reference=T((_PY.format("print(con.execute(\"select sql from sqlite_master\").fetchall())"),
                  _PY.format("print(con.execute(\"select round(sum(quantity * price), 2) from orders where day "
                             "like '2024-03-%'\").fetchone())")), f"The March 2024 revenue was {_MARCH:.2f}."),
     wrong=T((_PY.format("print(con.execute(\"select round(sum(price), 2) from orders where day like '2024-03-%'\")"
                         ".fetchone())"),),
             f"{round(sum(p for _, _, d, _, p, _ in _ORDERS if d.startswith('2024-03')), 2):.2f}"))

_add(id="sqlite-top-customer", category="sqlite",
     instruction="shop.db is a SQLite database (python3's sqlite3 module can read it). Which customer spent the "
                 "most in total, over all their orders (quantity times price)? Finish your answer with the name.",
     files={"shop.db": _SHOP}, verify=lambda f, a: names_only(a, max(_SPENT, key=_SPENT.get), list(_SPENT)),
     reference=T((_PY.format("print(con.execute(\"select c.name, sum(o.quantity * o.price) s from orders o join "
                             "customers c on c.id = o.customer_id group by c.name order by s desc\").fetchall())"),),
                 f"The top customer is {max(_SPENT, key=_SPENT.get)}."),
     wrong=T((_PY.format("print(con.execute(\"select customer_id, count(*) n from orders group by customer_id "
                         "order by n desc\").fetchall())"),), f"The top customer is {_MOST_ORDERS}."))

# the whole database, not the orders alone: "every other row as it is" holds the customers too, and no table,
# view or trigger added or changed
_EVERYTHING = ("select 'c', id, name, null, null, null, null from customers union all select 's', type, name, "
               "tbl_name, sql, null, null from sqlite_master union all select 'o', * from orders order by 1, 2, 3")


def _queried(data, query, change=""):
    """The rows of `query` (as JSON gives them back) on a copy of the database bytes `data` after `change`: the
    expectation, computed here on the exercise's own database."""
    with tempfile.TemporaryDirectory(prefix="minigrpo-terminal-") as d:
        path = os.path.join(d, "db.sqlite")
        with open(path, "wb") as f:
            f.write(data)
        con = sqlite3.connect(path)
        try:
            with con:
                con.executescript(change)
            return json.loads(json.dumps(con.execute(query).fetchall()))
        finally:
            con.close()


_CANCEL = "update orders set status = 'cancelled' where customer_id = (select id from customers where name = 'dave')"
_CANCELLED = _queried(_SHOP, _EVERYTHING, _CANCEL)
_add(id="sqlite-cancel-orders", category="sqlite",
     instruction="In the SQLite database shop.db, set the status of every order of the customer named dave to "
                 "'cancelled'. Leave every other row as it is.",
     files={"shop.db": _SHOP},
     verify=lambda f, a: 1.0 if _rows(f, "shop.db", _EVERYTHING) == _CANCELLED else 0.0,
     reference=T((_PY.format("con.execute(\"update orders set status = 'cancelled' where customer_id = (select id "
                             "from customers where name = 'dave')\")\ncon.commit()"),
                  _PY.format("print(con.execute(\"select status, count(*) from orders group by status\")"
                             ".fetchall())")),),
     wrong=T((_PY.format("con.execute(\"update orders set status = 'cancelled' where customer_id = (select id "
                         "from customers where name = 'dave')\")"),),))

# --- people: a CSV into SQLite, and filtered ---------------------------------------------------------------------

_PEOPLE = [("Ada", 36, "London"), ("Bo", 17, "Oslo"), ("Cy", 18, "New York"), ("Di", 45, "Lima"),
           ("Ed", 12, "Rome"), ("Flo", 18, "San Jose"), ("Gil", 19, "Oslo")]
_PEOPLE_CSV = "name,age,city\n" + "".join(f"{n},{a},{c}\n" for n, a, c in _PEOPLE)
# the rows with the types stored, and the table's columns: exactly name, age and city
_COLUMNS = "name,age,city"
_IMPORTED = ("select name, typeof(name), age, typeof(age), city, typeof(city), (select group_concat(name, ',') from "
             "pragma_table_info('people')) from people order by rowid")
_add(id="csv-into-sqlite", category="sqlite",
     instruction="Import people.csv into a new SQLite database people.db, as a table people with the columns "
                 "name, age and city: one row per line of the file after its header, in order, the ages stored "
                 "as integers.",
     files={"people.csv": _PEOPLE_CSV},
     verify=lambda f, a: 1.0 if _rows(f, "people.db", _IMPORTED) == [[n, "text", a, "integer", c, "text", _COLUMNS]
                                                                   for n, a, c in _PEOPLE] else 0.0,
     reference=T(("python3 - <<'EOF'\nimport csv, sqlite3\ncon = sqlite3.connect('people.db')\ncon.execute('create "
                  "table people (name text, age integer, city text)')\nrows = [(r['name'], int(r['age']), r['city']) "
                  "for r in csv.DictReader(open('people.csv'))]\ncon.executemany('insert into people values (?, ?, ?)',"
                  " rows)\ncon.commit()\nEOF",),),
     wrong=T(("python3 - <<'EOF'\nimport csv, sqlite3\ncon = sqlite3.connect('people.db')\ncon.execute('create "
              "table people (name, age, city)')\nrows = list(csv.reader(open('people.csv')))[1:]\n"
              "con.executemany('insert into people values (?, ?, ?)', rows)\ncon.commit()\nEOF",),))

_add(id="csv-filter-adults", category="csv",
     instruction="Write adults.csv: the header line of people.csv, then only the rows whose age is 18 or more, in "
                 "their original order.",
     files={"people.csv": _PEOPLE_CSV},
     verify=lambda f, a: lines_are(f, "adults.csv", ["name,age,city"] + [f"{n},{a},{c}" for n, a, c in _PEOPLE
                                                                          if a >= 18]),
     reference=T(("awk -F, 'NR == 1 || $2 >= 18' people.csv > adults.csv", "cat adults.csv"),),
     wrong=T(("awk -F, 'NR == 1 || $2 > 18' people.csv > adults.csv",),))

# --- sales per region ------------------------------------------------------------------------------------------------


def _sales():
    rng = random.Random(5)
    return [(f"2024-07-{d:02d}", rng.choice(["North", "East", "South", "West"]), rng.randint(100, 99999) / 100)
            for d in range(1, 29)]


_SALES = _sales()
_TOTALS = {}
for _day, _region, _amount in _SALES:
    _TOTALS[_region] = _TOTALS.get(_region, 0.0) + _amount
_add(id="csv-region-report", category="csv",
     instruction="sales.csv has the columns date, region and amount. Write report.txt with one line per region, "
                 "`REGION TOTAL`, the regions in alphabetical order and each total (the sum of its amounts) with "
                 "exactly two decimals.",
     files={"sales.csv": "date,region,amount\n" + "".join(f"{d},{r},{a:.2f}\n" for d, r, a in _SALES)},
     verify=lambda f, a: lines_are(f, "report.txt", [f"{r} {t:.2f}" for r, t in sorted(_TOTALS.items())]),
     reference=T(("head -3 sales.csv", "awk -F, 'NR > 1 {s[$2] += $3} END {for (r in s) printf \"%s %.2f\\n\", r, "
                  "s[r]}' sales.csv | sort > report.txt", "cat report.txt"),),
     wrong=T(("awk -F, '{s[$2] += $3} END {for (r in s) printf \"%s %.2f\\n\", r, s[r]}' sales.csv | sort "
              "> report.txt",),))

# --- a sum over quoted fields -----------------------------------------------------------------------------------------

_BILLS = [(1, "Smith, John", 12.5), (2, "Ann Lee", 7.25), (3, "Doe, Jane", 30.0), (4, "Bo", 5.75),
          (5, "Ng, Kim", 41.1), (6, "Al", 3.4)]
_buf = io.StringIO()
csv.writer(_buf, lineterminator="\n").writerows([("id", "customer", "total")] + [(i, c, f"{t:.2f}")
                                                                                for i, c, t in _BILLS])
_BILL_SUM = round(sum(t for _, _, t in _BILLS), 2)
_add(id="csv-quoted-sum", category="csv",
     instruction="What is the sum of the total column of orders.csv? Finish your answer with the number.",
     files={"orders.csv": _buf.getvalue()}, verify=lambda f, a: number_is(a, _BILL_SUM, tol=0.006),
     reference=T(("head -3 orders.csv", "python3 -c \"import csv; print(round(sum(float(r['total']) for r in "
                  "csv.DictReader(open('orders.csv'))), 2))\""), f"The total is {_BILL_SUM:.2f}."),
     wrong=T(("awk -F, 'NR > 1 {s += $3} END {print s}' orders.csv",),
             f"The total is {round(sum(t for _, c, t in _BILLS if ',' not in c), 2):g}."))

# --- CSV to JSON with types ----------------------------------------------------------------------------------------

_USERS = [{"id": 1, "name": "ada", "age": 36, "email": "ada@example.org"},
          {"id": 2, "name": "bo", "age": 17, "email": "bo@example.org"},
          {"id": 3, "name": "cy", "age": 52, "email": "cy@example.net"}]


def _users_json(f, a):
    text = f.text("users.json", cap=MAX_READ)
    try:
        got = json.loads(text) if text is not None else None
    except ValueError:
        return 0.0
    if not isinstance(got, list) or len(got) != len(_USERS):
        return 0.0
    ok = all(isinstance(g, dict) and g == w and all(type(g[k]) is type(v) for k, v in w.items())
             for g, w in zip(got, _USERS))
    return 1.0 if ok else 0.0


_add(id="csv-to-json", category="csv",
     instruction="Convert users.csv into users.json: a JSON list with one object per row, in order, keyed by the "
                 "header's names, with id and age as numbers and the other fields as strings.",
     files={"users.csv": "id,name,age,email\n" + "".join(f"{u['id']},{u['name']},{u['age']},{u['email']}\n"
                                                          for u in _USERS)},
     verify=_users_json,
     reference=T(("python3 - <<'EOF'\nimport csv, json\nrows = [dict(r, id=int(r['id']), age=int(r['age'])) for r in "
                  "csv.DictReader(open('users.csv'))]\njson.dump(rows, open('users.json', 'w'), indent=1)\nEOF",
                  "cat users.json"),),
     wrong=T(("python3 -c \"import csv, json; json.dump(list(csv.DictReader(open('users.csv'))), "
              "open('users.json', 'w'))\"",),))
