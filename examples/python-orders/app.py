"""A small order service whose create is exactly-once through idem's SQL functions.

POST /orders with an Idempotency-Key header: idem_claim, the order row and idem_finish
run in one transaction, so the order and its idempotency record commit (or roll back)
together. A duplicate waits on the first one's uncommitted record inside idem_claim and
then replays its stored answer. The tenant is fixed and the principal comes from the
X-User header: a real service takes both from authentication.
"""

import json
import os
import time
import uuid

import psycopg
from flask import Flask, Response, request
from psycopg import sql

from fingerprint import DuplicateMember, fingerprint

TENANT = "python-orders"
LEASE_MS = 30_000


def create_app(url: str, schema: str) -> Flask:
    app = Flask(__name__)
    s = sql.Identifier(schema)
    # Widens the window in which duplicates overlap (the self-check sets it).
    delay = float(os.environ.get("ORDERS_CREATE_DELAY_S", "0"))

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {}.orders (id bigserial PRIMARY KEY, "
            "idem_key text NOT NULL, sku text NOT NULL, quantity integer NOT NULL)"
        ).format(s))

    claim = sql.SQL(
        "SELECT decision, version, status, headers::text, body "
        "FROM {}.idem_claim(%s, %s, %s, %s, %s, %s)").format(s)
    finish = sql.SQL(
        "SELECT version FROM {}.idem_finish(%s, %s, %s, %s, 'succeeded', %s, %s::jsonb, %s, %s)"
    ).format(s)
    insert = sql.SQL(
        "INSERT INTO {}.orders (idem_key, sku, quantity) VALUES (%s, %s, %s) RETURNING id"
    ).format(s)

    def problem(status: int, detail: str) -> Response:
        return Response(json.dumps({"status": status, "detail": detail}), status,
                        mimetype="application/problem+json")

    @app.post("/orders")
    def create_order():
        key = request.headers.get("Idempotency-Key")
        if not key:
            return problem(400, "Idempotency-Key header required")
        principal = request.headers.get("X-User", "anonymous")
        body = request.get_data()
        try:
            fp = fingerprint(request.method, request.path, request.query_string.decode(),
                             principal, request.content_type, body)
        except DuplicateMember:
            return problem(400, "a JSON member appears twice")
        owner = "py-" + uuid.uuid4().hex
        with psycopg.connect(url) as conn:  # one transaction, committed on exit
            try:
                decision, version, status, headers, stored = conn.execute(
                    claim, (TENANT, key, fp, principal, owner, LEASE_MS)).fetchone()
            except psycopg.Error as e:
                conn.rollback()
                if e.sqlstate == "ID001":
                    return problem(400, e.diag.message_primary)
                raise
            if decision == "replay":
                resp = Response(bytes(stored or b""), status)
                for name, value in json.loads(headers or "[]"):
                    resp.headers[name] = value
                resp.headers["Idempotent-Replayed"] = "true"
                return resp
            if decision == "in_progress":
                conn.rollback()
                return problem(409, "this request is still being processed; retry later")
            if decision == "mismatch":
                conn.rollback()
                return problem(422, "this Idempotency-Key was used with another request")
            order = json.loads(body)
            if delay:
                time.sleep(delay)
            (order_id,) = conn.execute(insert, (key, order["sku"], order["quantity"])).fetchone()
            answer = json.dumps({"id": order_id, "sku": order["sku"],
                                 "quantity": order["quantity"]}).encode()
            answer_headers = [["content-type", "application/json"]]
            conn.execute(finish, (TENANT, key, owner, version, 201, json.dumps(answer_headers),
                                  answer, f"order:{order_id}"))
        return Response(answer, 201, mimetype="application/json")

    return app
