"""The two databases the service runs on, behind one small interface: connecting, the
orders table, a transaction, and the calls of idem's key-state machine (functions on
PostgreSQL, procedures on MySQL/MariaDB, with the same arguments and answers)."""

import contextlib
import json
import queue
import urllib.parse

# The headers every stored answer of a create has, as idem_finish takes them.
ANSWER_HEADERS = json.dumps([["content-type", "application/json"]])


def answer_around_id(sku: str, quantity: int):
    """A create's answer, json.dumps of {"id", "sku", "quantity"}, as the text before and
    after the order id, which exists only once the row is in."""
    rest = json.dumps({"sku": sku, "quantity": quantity})
    return '{"id": ', ", " + rest[1:]


def order_answer(order_id: int, sku: str, quantity: int) -> bytes:
    before, after = answer_around_id(sku, quantity)
    return f"{before}{order_id}{after}".encode()


def open_db(url: str, schema: str):
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme in ("postgres", "postgresql"):
        return Postgres(url, schema)
    if scheme in ("mysql", "mariadb"):
        return Mysql(url)
    raise ValueError(f"unsupported database URL scheme {scheme!r}")


class Pool:
    """A few reused connections: the service's cost is its statements, not connecting."""

    def __init__(self, connect, idle_ok, size: int = 8):
        self.connect, self.idle_ok = connect, idle_ok
        self.idle = queue.LifoQueue()
        for _ in range(size):
            self.idle.put(None)

    @contextlib.contextmanager
    def conn(self):
        conn = self.idle.get()
        try:
            if conn is None:
                conn = self.connect()
            yield conn
        finally:
            # A connection left inside a transaction (or broken) is not reused.
            if conn is not None and not self.idle_ok(conn):
                with contextlib.suppress(Exception):
                    conn.close()
                conn = None
            self.idle.put(conn)


class Postgres:
    def __init__(self, url, schema):
        import psycopg
        from psycopg import sql
        self.psycopg, self.url = psycopg, url
        s = sql.Identifier(schema)
        self.ddl = sql.SQL(
            "CREATE TABLE IF NOT EXISTS {}.orders (id bigserial PRIMARY KEY, "
            "tenant text NOT NULL, idem_key text, sku text NOT NULL, quantity integer NOT NULL)"
        ).format(s)
        self.claim_sql = sql.SQL(
            "SELECT decision, version, status, headers::text, body "
            "FROM {}.idem_claim(%s, %s, %s, %s, %s, %s)").format(s)
        self.finish_sql = sql.SQL(
            "SELECT version FROM {}.idem_finish(%s, %s, %s, %s, 'succeeded', %s, %s::jsonb, %s, %s)"
        ).format(s)
        self.insert_sql = sql.SQL(
            "INSERT INTO {}.orders (tenant, idem_key, sku, quantity) VALUES (%s, %s, %s, %s) "
            "RETURNING id").format(s)
        self.count_sql = sql.SQL("SELECT count(*) FROM {}.orders WHERE idem_key = %s").format(s)
        self.pool = Pool(lambda: psycopg.connect(url), lambda c: not c.closed and
                         c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE)

    def create_table(self):
        with self.psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(self.ddl)

    @contextlib.contextmanager
    def transaction(self):
        """A connection in a transaction: committed on a normal exit, else rolled back."""
        with self.pool.conn() as conn, conn.transaction():
            yield conn

    def claim(self, conn, *args):
        """(decision, version, status, headers as JSON text, body)."""
        return conn.execute(self.claim_sql, args).fetchone()

    def insert(self, conn, tenant, key, sku, quantity):
        return conn.execute(self.insert_sql, (tenant, key, sku, quantity)).fetchone()[0]

    def insert_and_finish(self, conn, tenant, key, owner, version, sku, quantity):
        """The order row, then the finish storing the create's answer (201) with it.
        Returns (order id, answer)."""
        order_id = self.insert(conn, tenant, key, sku, quantity)
        answer = order_answer(order_id, sku, quantity)
        conn.execute(self.finish_sql, (tenant, key, owner, version, 201, ANSWER_HEADERS,
                                       answer, f"order:{order_id}"))
        return order_id, answer

    def invalid_argument(self, e):
        """The message of idem's 'invalid argument' (SQLSTATE ID001), else None."""
        if isinstance(e, self.psycopg.Error) and e.sqlstate == "ID001":
            return e.diag.message_primary
        return None


class Mysql:
    # MariaDB reports a SIGNAL as error 1644; PyMySQL drops the SQLSTATE (ID001 …), so
    # idem's argument errors are told apart by their text ("idem: … must be …").
    SIGNAL = 1644
    # SERVER_STATUS_IN_TRANS: the session is inside a transaction.
    IN_TRANS = 1

    def __init__(self, url):
        import pymysql
        from pymysql.constants import CLIENT
        self.pymysql = pymysql
        u = urllib.parse.urlsplit(url)
        self.connect_args = dict(host=u.hostname or "127.0.0.1", port=u.port or 3306,
                                 user=urllib.parse.unquote(u.username or "root"),
                                 password=urllib.parse.unquote(u.password or ""),
                                 database=u.path.lstrip("/"), autocommit=True,
                                 # READ COMMITTED: after waiting on a duplicate's
                                 # record, the claim reads the committed winner.
                                 init_command="SET SESSION TRANSACTION ISOLATION LEVEL "
                                              "READ COMMITTED")
        # The pooled sessions run without autocommit, so a transaction starts with its
        # first statement (no round trip for BEGIN), and take several statements in one
        # round trip (the finish and the COMMIT).
        pooled = {**self.connect_args, "autocommit": False,
                  "client_flag": CLIENT.MULTI_STATEMENTS}
        self.pool = Pool(lambda: pymysql.connect(**pooled),
                         lambda c: c.open and not c.server_status & self.IN_TRANS)

    def create_table(self):
        conn = self.pymysql.connect(**self.connect_args)
        try:
            with conn.cursor() as c:
                c.execute("CREATE TABLE IF NOT EXISTS orders (id BIGINT AUTO_INCREMENT PRIMARY "
                          "KEY, tenant VARCHAR(128) NOT NULL, idem_key VARCHAR(255), "
                          "sku VARCHAR(255) NOT NULL, quantity INT NOT NULL) ENGINE = InnoDB")
        finally:
            conn.close()

    @contextlib.contextmanager
    def transaction(self):
        """A connection whose next statement starts a transaction: committed on a normal
        exit (unless the finish already committed it), else rolled back."""
        with self.pool.conn() as conn:
            try:
                yield conn
                if conn.server_status & self.IN_TRANS:
                    conn.commit()
            except BaseException:
                conn.rollback()
                raise

    def call(self, conn, procedure, args):
        with conn.cursor() as c:
            c.execute(f"CALL {procedure}({', '.join(['%s'] * len(args))})", args)
            row = c.fetchone()
            while c.nextset():  # the CALL's own status comes last
                pass
        return row

    def claim(self, conn, tenant, key, fp, principal, owner, lease_ms):
        # The procedure answers the PostgreSQL function's columns, in its order: decision,
        # kind, version, attempt, lease_expires_at, now_ms, state, owner, status, headers,
        # body, ...
        row = self.call(conn, "idem_claim", (tenant, key, fp, principal, owner, lease_ms))
        return row[0], row[2], row[8], row[9], row[10]

    def insert(self, conn, tenant, key, sku, quantity):
        with conn.cursor() as c:
            c.execute("INSERT INTO orders (tenant, idem_key, sku, quantity) VALUES (%s, %s, %s, %s)",
                      (tenant, key, sku, quantity))
            return c.lastrowid

    def insert_and_finish(self, conn, tenant, key, owner, version, sku, quantity):
        """The transaction's last round trip: the order row, the finish storing the
        create's answer (201) and the COMMIT in one batch. The answer holds the order id,
        so the server puts LAST_INSERT_ID() into it (and into the result reference) and
        this side builds the same bytes from the insert's id. A refused insert or finish
        stops the batch before the COMMIT; the caller rolls back. Returns (order id,
        answer)."""
        before, after = answer_around_id(sku, quantity)
        with conn.cursor() as c:
            c.execute("INSERT INTO orders (tenant, idem_key, sku, quantity) "
                      "VALUES (%s, %s, %s, %s); "
                      "CALL idem_finish(%s, %s, %s, %s, 'succeeded', 201, %s, "
                      "CONCAT(%s, LAST_INSERT_ID(), %s), CONCAT('order:', LAST_INSERT_ID())); "
                      "COMMIT",
                      (tenant, key, sku, quantity,
                       tenant, key, owner, version, ANSWER_HEADERS, before, after))
            order_id = c.lastrowid  # the insert's: the first result of the batch
            while c.nextset():  # the finish's answer (or its error), its status, the COMMIT
                pass
        return order_id, f"{before}{order_id}{after}".encode()

    def invalid_argument(self, e):
        if isinstance(e, self.pymysql.err.MySQLError) and e.args and e.args[0] == self.SIGNAL \
                and "must be" in str(e.args[1]):
            return e.args[1]
        return None
