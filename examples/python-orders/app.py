"""A small order service whose create is exactly-once through idem's SQL functions
(PostgreSQL) or procedures (MySQL/MariaDB).

POST /orders with an Idempotency-Key header: idem_claim, the order row and idem_finish
run in one transaction, so the order and its idempotency record commit (or roll back)
together. A duplicate waits on the first one's uncommitted record inside idem_claim and
then replays its stored answer.

Who the caller is: behind `idem gateway` (ORDERS_GATEWAY_TOKEN set) the tenant and the
principal come from the gateway's x-idem-tenant / x-idem-principal headers, accepted only
with the gateway's x-idem-gateway-token. Without a gateway (the self-check's direct
checks) the tenant is fixed and the principal is the X-User header: a real service takes
both from its own authentication.

Run: python app.py --url URL --schema SCHEMA --port PORT (the schema: PostgreSQL only; a
MySQL URL names its database)
"""

import argparse
import hmac
import json
import os
import time
import uuid

from flask import Flask, Response, request

from db import open_db, order_answer
from fingerprint import DuplicateMember, fingerprint

TENANT = "python-orders"
LEASE_MS = 30_000


def problem(status: int, detail: str) -> Response:
    return Response(json.dumps({"status": status, "detail": detail}), status,
                    mimetype="application/problem+json")


def create_app(url: str, schema: str) -> Flask:
    app = Flask(__name__)
    # Widens the window in which duplicates overlap (the self-check sets it).
    delay = float(os.environ.get("ORDERS_CREATE_DELAY_S", "0"))
    # The crash drill: a create with this key writes its order row, tells the file
    # ORDERS_HOLD_FILE and then waits to be killed before it commits.
    hold_key = os.environ.get("ORDERS_HOLD_KEY")
    hold_file = os.environ.get("ORDERS_HOLD_FILE")
    gateway_token = os.environ.get("ORDERS_GATEWAY_TOKEN")
    db = open_db(url, schema)
    db.create_table()

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
        try:
            with db.transaction() as conn:  # the claim, the order and the finish commit together
                decision, version, status, headers, stored = db.claim(
                    conn, tenant, key, fp, principal, owner, LEASE_MS)
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
                if key == hold_key:
                    db.insert(conn, tenant, key, sku, quantity)
                    open(hold_file, "w").close()
                    time.sleep(600)
                # The order row and the finish storing this answer, and the commit.
                _, answer = db.insert_and_finish(conn, tenant, key, owner, version, sku,
                                                 quantity)
            return Response(answer, 201, mimetype="application/json")
        except Exception as e:
            # Raised out of the transaction block, so it rolled back.
            message = db.invalid_argument(e)
            if message is not None:
                return problem(400, message)
            raise

    @app.post("/plain-orders")
    def create_plain_order():
        """The same create without the guard: the baseline the self-check measures against."""
        order = parse_order(request.get_data())
        if order is None:
            return problem(400, "the body must be {\"sku\": text, \"quantity\": positive integer}")
        sku, quantity = order
        with db.transaction() as conn:
            order_id = db.insert(conn, TENANT, None, sku, quantity)
        return Response(order_answer(order_id, sku, quantity), 201, mimetype="application/json")

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
