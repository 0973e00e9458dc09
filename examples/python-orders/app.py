"""A small order service whose create is exactly-once through idem's SQL functions.

POST /orders with an Idempotency-Key header: idem_claim, the order row and idem_finish
run in one transaction, so the order and its idempotency record commit (or roll back)
together. A duplicate waits on the first one's uncommitted record inside idem_claim and
then replays its stored answer.

Who the caller is: behind `idem gateway` (ORDERS_GATEWAY_TOKEN set) the tenant and the
principal come from the gateway's x-idem-tenant / x-idem-principal headers, accepted only
with the gateway's x-idem-gateway-token. Without a gateway (the self-check's direct
checks) the tenant is fixed and the principal is the X-User header: a real service takes
both from its own authentication.

Run: python app.py --url URL --schema SCHEMA --port PORT
"""

import argparse
import hmac
import json
import os
import queue
import time
import uuid

import psycopg
from flask import Flask, Response, request
from psycopg import sql

from fingerprint import DuplicateMember, fingerprint

TENANT = "python-orders"
LEASE_MS = 30_000


class Pool:
    """A few reused connections: the service's cost is its statements, not connecting."""

    def __init__(self, url: str, size: int = 8):
        self.url = url
        self.idle = queue.LifoQueue()
        for _ in range(size):
            self.idle.put(None)

    def take(self):
        conn = self.idle.get()
        if conn is None or conn.closed:
            conn = psycopg.connect(self.url)
        return conn

    def give(self, conn):
        # A connection left inside a failed transaction is not reused.
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.close()
            conn = None
        self.idle.put(conn)


def problem(status: int, detail: str) -> Response:
    return Response(json.dumps({"status": status, "detail": detail}), status,
                    mimetype="application/problem+json")


def create_app(url: str, schema: str) -> Flask:
    app = Flask(__name__)
    s = sql.Identifier(schema)
    # Widens the window in which duplicates overlap (the self-check sets it).
    delay = float(os.environ.get("ORDERS_CREATE_DELAY_S", "0"))
    # The crash drill: a create with this key writes its order row, tells the file
    # ORDERS_HOLD_FILE and then waits to be killed before it commits.
    hold_key = os.environ.get("ORDERS_HOLD_KEY")
    hold_file = os.environ.get("ORDERS_HOLD_FILE")
    gateway_token = os.environ.get("ORDERS_GATEWAY_TOKEN")
    pool = Pool(url)

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {}.orders (id bigserial PRIMARY KEY, "
            "tenant text NOT NULL, idem_key text, sku text NOT NULL, quantity integer NOT NULL)"
        ).format(s))

    claim = sql.SQL(
        "SELECT decision, version, status, headers::text, body "
        "FROM {}.idem_claim(%s, %s, %s, %s, %s, %s)").format(s)
    finish = sql.SQL(
        "SELECT version FROM {}.idem_finish(%s, %s, %s, %s, 'succeeded', %s, %s::jsonb, %s, %s)"
    ).format(s)
    insert = sql.SQL(
        "INSERT INTO {}.orders (tenant, idem_key, sku, quantity) VALUES (%s, %s, %s, %s) "
        "RETURNING id").format(s)

    def caller():
        """(tenant, principal), or a problem when the caller is not who it says."""
        if gateway_token is None:
            return TENANT, request.headers.get("X-User", "anonymous"), None
        sent = request.headers.get("x-idem-gateway-token", "")
        if not hmac.compare_digest(sent.encode(), gateway_token.encode()):
            return None, None, problem(403, "requests must come through the gateway")
        tenant = request.headers.get("x-idem-tenant")
        principal = request.headers.get("x-idem-principal") or tenant
        if not tenant:
            return None, None, problem(403, "no tenant from the gateway")
        return tenant, principal, None

    def parse_order(body: bytes):
        try:
            order = json.loads(body)
            sku, quantity = order["sku"], order["quantity"]
        except (ValueError, KeyError, TypeError):
            return None
        if not isinstance(sku, str) or not isinstance(quantity, int) or quantity < 1:
            return None
        return sku, quantity

    @app.post("/orders")
    def create_order():
        tenant, principal, refused = caller()
        if refused:
            return refused
        key = request.headers.get("Idempotency-Key")
        if not key:
            return problem(400, "Idempotency-Key header required")
        body = request.get_data()
        try:
            fp = fingerprint(request.method, request.path, request.query_string.decode(),
                             principal, request.content_type, body)
        except DuplicateMember:
            return problem(400, "a JSON member appears twice")
        order = parse_order(body)
        if order is None:
            return problem(400, "the body must be {\"sku\": text, \"quantity\": positive integer}")
        sku, quantity = order
        owner = "py-" + uuid.uuid4().hex
        conn = pool.take()
        try:
            with conn.transaction():  # the claim, the order and the finish commit together
                decision, version, status, headers, stored = conn.execute(
                    claim, (tenant, key, fp, principal, owner, LEASE_MS)).fetchone()
                if decision == "replay":
                    resp = Response(bytes(stored or b""), status)
                    for name, value in json.loads(headers or "[]"):
                        resp.headers[name] = value
                    resp.headers["Idempotent-Replayed"] = "true"
                    return resp
                if decision == "in_progress":
                    return problem(409, "this request is still being processed; retry later")
                if decision == "mismatch":
                    return problem(422, "this Idempotency-Key was used with another request")
                if delay:
                    time.sleep(delay)
                (order_id,) = conn.execute(insert, (tenant, key, sku, quantity)).fetchone()
                if key == hold_key:
                    open(hold_file, "w").close()
                    time.sleep(600)
                answer = json.dumps({"id": order_id, "sku": sku, "quantity": quantity}).encode()
                answer_headers = [["content-type", "application/json"]]
                conn.execute(finish, (tenant, key, owner, version, 201, json.dumps(answer_headers),
                                      answer, f"order:{order_id}"))
            return Response(answer, 201, mimetype="application/json")
        except psycopg.Error as e:
            # Raised out of the transaction block, so it rolled back.
            if e.sqlstate == "ID001":
                return problem(400, e.diag.message_primary)
            raise
        finally:
            pool.give(conn)

    @app.post("/plain-orders")
    def create_plain_order():
        """The same create without the guard: the baseline the self-check measures against."""
        order = parse_order(request.get_data())
        if order is None:
            return problem(400, "the body must be {\"sku\": text, \"quantity\": positive integer}")
        sku, quantity = order
        conn = pool.take()
        try:
            with conn.transaction():
                (order_id,) = conn.execute(insert, (TENANT, None, sku, quantity)).fetchone()
            answer = json.dumps({"id": order_id, "sku": sku, "quantity": quantity}).encode()
            return Response(answer, 201, mimetype="application/json")
        finally:
            pool.give(conn)

    @app.get("/health")
    def health():
        return {"status": "ok"}

    return app


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--schema", required=True)
    p.add_argument("--port", type=int, required=True)
    a = p.parse_args()
    from werkzeug.serving import make_server
    import logging
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    make_server("127.0.0.1", a.port, create_app(a.url, a.schema), threaded=True).serve_forever()


if __name__ == "__main__":
    main()
