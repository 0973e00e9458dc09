"""Checks the python-orders example end to end; exits non-zero on a failure.

For each database: a fresh schema migrated by `idem migrate`; the app as a real process;
duplicates, mismatches and bad keys; a crash between claim and commit (SIGKILL); `idem
gateway` in front; the records read back by `idem keys show`, `idem console` and moved
through the tiers by `idem sweep`; the create's throughput with the guard against the
same create without it.
"""

import argparse
import http.cookiejar
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import psycopg
from psycopg import sql

from fingerprint import DuplicateMember, fingerprint

HERE = os.path.dirname(os.path.abspath(__file__))
TENANT = "python-orders"
ADMIN_TOKEN = "python-orders-admin-token-0123"
failures = []


def check(ok: bool, what: str):
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        failures.append(what)


def request(url, data=None, headers=None, method=None, opener=None, timeout=60):
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with (opener.open if opener else urllib.request.urlopen)(req, timeout=timeout) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def post(base, key, payload, user="alice", extra=None, path="/orders"):
    headers = {"X-User": user, "Content-Type": "application/json", **(extra or {})}
    if key is not None:
        headers["Idempotency-Key"] = key
    return request(base + path, json.dumps(payload).encode(), headers, "POST")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url, proc, what):
    for _ in range(200):
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except (urllib.error.URLError, ConnectionError, OSError):
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not come up at {url}")


def start_app(db, env=None):
    port = free_port()
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "app.py"), "--url", db.app_url,
                             "--schema", db.schema, "--port", str(port)],
                            env={**os.environ, **(env or {})})
    base = f"http://127.0.0.1:{port}"
    wait_up(base + "/health", proc, "the app")
    return proc, base


def stop(proc):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def vectors(path):
    doc = json.load(open(path))
    wrong = []
    for v in doc["vectors"]:
        i = v["input"]
        body = bytes.fromhex(i["body_hex"]) if "body_hex" in i else i["body"].encode()
        try:
            got = fingerprint(i["method"], i["path"], i["query"], i["principal"], i["content_type"],
                              body, [tuple(p) for p in i["headers"]], i["fingerprint_headers"],
                              i["omit_fields"]).hex()
        except DuplicateMember:
            got = "refused"
        if got != v.get("digest", "refused"):
            wrong.append(v["name"])
    check(not wrong, f"the Python fingerprint reproduces {len(doc['vectors'])} published vectors"
          + (f" (wrong: {wrong})" if wrong else ""))


class Postgres:
    """The database under test: a fresh schema, and what `idem` is given to reach it."""

    name = "PostgreSQL"

    def __init__(self, url):
        self.url = self.app_url = url
        self.schema = f"idem_pyorders_{int(time.time())}_{os.getpid()}"
        sep = "&" if "?" in url else "?"
        # The idem commands reach the schema through the connection's search_path.
        self.idem_url = url + sep + urllib.parse.urlencode(
            {"options": f"-c search_path={self.schema}"})

    def create(self):
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(self.schema)))

    def drop(self):
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE")
                         .format(sql.Identifier(self.schema)))

    def orders(self, key, tenant=None):
        q = "SELECT count(*) FROM {}.orders WHERE idem_key = %s"
        args = [key]
        if tenant:
            q += " AND tenant = %s"
            args.append(tenant)
        with psycopg.connect(self.url) as conn:
            (n,) = conn.execute(sql.SQL(q).format(sql.Identifier(self.schema)), args).fetchone()
        return n


class Mysql:
    """A fresh database on the server (MySQL's schemas are databases)."""

    name = "MySQL/MariaDB"

    def __init__(self, url):
        import pymysql
        self.pymysql = pymysql
        u = urllib.parse.urlsplit(url)
        self.schema = f"idem_pyorders_{int(time.time())}_{os.getpid()}"
        self.server = dict(host=u.hostname or "127.0.0.1", port=u.port or 3306,
                           user=urllib.parse.unquote(u.username or "root"),
                           password=urllib.parse.unquote(u.password or ""), autocommit=True)
        self.idem_url = self.app_url = urllib.parse.urlunsplit(
            (u.scheme, u.netloc, "/" + self.schema, u.query, ""))

    def sql(self, statement, args=()):
        conn = self.pymysql.connect(**self.server)
        try:
            with conn.cursor() as c:
                c.execute(statement, args)
                return c.fetchone()
        finally:
            conn.close()

    def create(self):
        self.sql(f"CREATE DATABASE `{self.schema}`")

    def drop(self):
        self.sql(f"DROP DATABASE IF EXISTS `{self.schema}`")

    def orders(self, key, tenant=None):
        q = f"SELECT count(*) FROM `{self.schema}`.orders WHERE idem_key = %s"
        args = [key]
        if tenant:
            q += " AND tenant = %s"
            args.append(tenant)
        return self.sql(q, args)[0]


class Idem:
    def __init__(self, binary, db):
        self.binary, self.db = binary, db

    def run(self, *args):
        r = subprocess.run([self.binary, *args, "--database-url", self.db.idem_url],
                           capture_output=True, text=True, timeout=120)
        return r.returncode, r.stdout, r.stderr

    def json(self, *args):
        code, out, err = self.run(*args, "--json")
        try:
            return code, json.loads(out)
        except ValueError:
            return code, {"unparsed": out, "stderr": err}


def duplicates_and_mismatches(db, base):
    payload = {"sku": "S-204", "quantity": 2}
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: post(base, "order-key-1", payload), range(8)))
    rows = db.orders("order-key-1")
    check(rows == 1, f"8 concurrent duplicates made {rows} order row(s), want 1")
    statuses = sorted(s for s, _, _ in answers)
    check(statuses == [201] * 8, f"all 8 answered 201 (got {statuses})")
    replayed = [a for a in answers if a[1].get("idempotent-replayed") == "true"]
    check(len(replayed) == 7, f"7 answers are replays (got {len(replayed)})")
    bodies = {b for _, _, b in answers}
    check(len(bodies) == 1, f"the 8 bodies are identical ({len(bodies)} distinct)")
    types = {h.get("content-type") for _, h, _ in answers}
    check(types == {"application/json"}, f"replays carry the stored content-type ({types})")

    status, _, body = post(base, "order-key-1", {"sku": "S-204", "quantity": 3})
    check(status == 422, f"same key, other body is refused with 422 (got {status} {body!r})")
    status, _, _ = post(base, "order-key-1", payload, user="mallory")
    check(status == 422, f"same key, other principal is refused with 422 (got {status})")
    status, _, body = post(base, "bad key", payload)
    check(status == 400, f"a key with a space is refused by idem_claim (got {status} {body!r})")
    status, _, _ = post(base, "order-key-2", payload)
    check(status == 201, "a second key makes a second order")


def crash_between_claim_and_commit(db, idem):
    """SIGKILL while the claim and the order row are written but not committed."""
    key = "order-crash-1"
    with tempfile.TemporaryDirectory() as tmp:
        hold = os.path.join(tmp, "holding")
        proc, base = start_app(db,
                               {"ORDERS_HOLD_KEY": key, "ORDERS_HOLD_FILE": hold})
        try:
            first = {}
            t = threading.Thread(target=lambda: first.update(
                answer=_try(lambda: post(base, key, {"sku": "S-9", "quantity": 1}))))
            t.start()
            for _ in range(400):
                if os.path.exists(hold):
                    break
                time.sleep(0.025)
            check(os.path.exists(hold), "the first attempt reached the point between claim "
                  "and commit")
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            t.join(30)
        finally:
            stop(proc)
    check(isinstance(first.get("answer"), Exception),
          f"the client saw the killed attempt fail ({first.get('answer')!r:.80})")
    rows = db.orders(key)
    check(rows == 0, f"the killed attempt left {rows} order row(s), want 0 (rolled back)")
    code, out, err = idem.run("keys", "show", "--tenant", TENANT, key)
    check(code != 0 and "no record" in (out + err).lower(),
          f"idem keys show finds no record of the killed attempt (exit {code}: "
          f"{(out + err).strip()[:80]})")
    proc, base = start_app(db)
    try:
        status, headers, _ = post(base, key, {"sku": "S-9", "quantity": 1})
    finally:
        stop(proc)
    check(status == 201 and "idempotent-replayed" not in headers,
          f"the retry after the crash executes (got {status}, {headers.get('idempotent-replayed')})")
    rows = db.orders(key)
    check(rows == 1, f"after the crash and the retry: {rows} order row(s), want 1")


def _try(f):
    try:
        return f()
    except Exception as e:  # the connection dies with the process
        return e


def behind_the_gateway(db, idem_bin):
    """`idem gateway` in front: its edge rules hold for a service in another language."""
    token = "python-orders-gateway-token-5150"
    proc, upstream = start_app(db, {"ORDERS_GATEWAY_TOKEN": token})
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = os.path.join(tmp, "gateway.json")
        json.dump({
            "listen": f"127.0.0.1:{port}", "upstream": upstream, "upstream_token": token,
            "routes": [{"methods": ["POST"], "path": "/orders", "key": "required"}],
            "auth": {"api_keys": {"alice-api-key-0001": {"tenant": "gw-a", "principal": "alice"},
                                  "bob-api-key-00002": {"tenant": "gw-b", "principal": "bob"}}},
            "max_body_bytes": 4096,
        }, open(cfg, "w"))
        gw = subprocess.Popen([idem_bin, "gateway", "--config", cfg,
                               "--database-url", f"sqlite://{tmp}/gateway.db"],
                              stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_up(base + "/_idem/health", gw, "idem gateway")
            auth = lambda k: {"X-Api-Key": k}  # noqa: E731
            payload = {"sku": "S-77", "quantity": 1}
            status, _, _ = post(base, "gw-key-1", payload)
            check(status == 401, f"gateway: no API key is refused (got {status})")
            status, _, _ = post(base, None, payload, extra=auth("alice-api-key-0001"))
            check(status == 400, f"gateway: a keyed route without a key is refused (got {status})")
            big = {"sku": "S" * 5000, "quantity": 1}
            status, _, _ = post(base, "gw-key-big", big, extra=auth("alice-api-key-0001"))
            check(status == 413, f"gateway: a body over its limit is refused (got {status})")
            with ThreadPoolExecutor(8) as pool:
                answers = list(pool.map(lambda _: post(base, "gw-key-1", payload,
                                                       extra=auth("alice-api-key-0001")),
                                        range(8)))
            statuses = sorted(s for s, _, _ in answers)
            rows = db.orders("gw-key-1", "gw-a")
            check(statuses == [201] * 8 and rows == 1,
                  f"gateway: 8 concurrent duplicates → 1 order ({rows}), all 201 ({statuses})")
            check(len({b for _, _, b in answers}) == 1, "gateway: the 8 bodies are identical")
            status, _, _ = post(base, "gw-key-1", {"sku": "S-77", "quantity": 9},
                                extra=auth("alice-api-key-0001"))
            check(status == 422, f"gateway: same key, other body is refused (got {status})")
            status, h, body = post(base, "gw-key-1", payload, extra=auth("bob-api-key-00002"))
            check(status == 201 and db.orders("gw-key-1", "gw-b") == 1
                  and body != answers[0][2],
                  f"gateway: another tenant's same key is its own order (got {status})")
            status, _, _ = post(upstream, "gw-key-2", payload,
                                extra={"x-idem-tenant": "gw-a", "x-idem-principal": "alice"})
            check(status == 403, "the app refuses a caller that bypasses the gateway "
                  f"(got {status})")
        finally:
            stop(gw)
            stop(proc)


def rust_side_reads(db, idem, idem_bin):
    code, rec = idem.json("keys", "show", "--tenant", TENANT, "order-key-1")
    check(code == 0 and rec.get("state") == "SUCCEEDED"
          and str(rec.get("result_ref", "")).startswith("order:"),
          f"idem keys show reads the Python service's record ({code}: "
          f"{rec.get('state')}, {rec.get('result_ref')})")

    port = free_port()
    console = subprocess.Popen([idem_bin, "console", "--database-url", db.idem_url,
                                "--listen", f"127.0.0.1:{port}"],
                               env={**os.environ, "IDEM_ADMIN_TOKEN": ADMIN_TOKEN},
                               stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_up(base + "/console/login", console, "idem console")
        opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        form = urllib.parse.urlencode({"token": ADMIN_TOKEN, "operator": "self-check"}).encode()
        status, _, _ = request(base + "/console/login", form,
                               {"Content-Type": "application/x-www-form-urlencoded"},
                               "POST", opener)
        status, _, page = request(f"{base}/console/keys/{TENANT}/order-key-1", opener=opener)
        page = page.decode(errors="replace")
        shown = status == 200 and "order-key-1" in page and "order:" in page
        if not shown:
            print(page[:3000])
        check(shown,
              f"idem console shows the Python service's record (got {status})")
    finally:
        stop(console)

    moved = {}
    for days in (3, 70, 600):
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + days * 86400))
        code, summary = idem.json("sweep", "--now", now)
        for step, n in summary.get("transitions", {}).items():
            moved[step] = moved.get(step, 0) + n
    check(all(moved.get(s, 0) >= 5 for s in ("retry->replay", "replay->dispute",
                                             "dispute->archive")),
          f"idem sweep moves the Python service's records through the tiers ({moved})")
    code, rec = idem.json("keys", "show", "--tenant", TENANT, "order-key-1")
    check(code == 0 and rec.get("tier") == "archive",
          f"after the sweeps the record is in the archive ({code}: {rec.get('tier')})")


def throughput(base, seconds=2.0, threads=8):
    """Creates per second over `seconds`, guarded (fresh keys) or plain."""
    def rate(path, run):
        stop_at = time.monotonic() + seconds
        count = [0] * threads

        def worker(i):
            n = 0
            while time.monotonic() < stop_at:
                status, _, _ = post(base, f"bench-{run}-{i}-{n}", {"sku": "S-1", "quantity": 1},
                                    path=path)
                if status != 201:
                    raise RuntimeError(f"{path} answered {status}")
                n += 1
            count[i] = n

        started = time.monotonic()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(worker, range(threads)))
        return sum(count) / (time.monotonic() - started)

    guarded, plain = [], []
    for run in range(2):  # alternate, so drift on a shared machine hits both sides
        plain.append(rate("/plain-orders", f"p{run}"))
        guarded.append(rate("/orders", f"g{run}"))
    g, p = sum(guarded) / 2, sum(plain) / 2
    print(f"      create with the guard {g:.0f}/s, without {p:.0f}/s: ratio {g / p:.2f} "
          f"(runs {[round(x) for x in guarded]} vs {[round(x) for x in plain]})", flush=True)
    check(g > 0 and p > 0, "the throughput runs completed")


def run_database(db, idem_bin, bench):
    print(f"== {db.name}", flush=True)
    db.create()
    try:
        idem = Idem(idem_bin, db)
        code, out, err = idem.run("migrate")
        check(code == 0, f"idem migrate applies the store's migrations ({err.strip()[-200:]})")
        proc, base = start_app(db, {"ORDERS_CREATE_DELAY_S": "0.2"})
        try:
            duplicates_and_mismatches(db, base)
        finally:
            stop(proc)
        crash_between_claim_and_commit(db, idem)
        behind_the_gateway(db, idem_bin)
        rust_side_reads(db, idem, idem_bin)
        if bench:
            proc, base = start_app(db)
            try:
                throughput(base)
            finally:
                stop(proc)
    finally:
        db.drop()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--idem", required=True, help="the idem binary")
    p.add_argument("--vectors", required=True)
    p.add_argument("--postgres-url")
    p.add_argument("--mysql-url")
    p.add_argument("--no-bench", action="store_true")
    a = p.parse_args()
    vectors(a.vectors)
    if a.postgres_url:
        run_database(Postgres(a.postgres_url), a.idem, not a.no_bench)
    if a.mysql_url:
        run_database(Mysql(a.mysql_url), a.idem, not a.no_bench)
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
