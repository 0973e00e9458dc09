"""Checks the python-orders example against PostgreSQL; exits non-zero on a failure."""

import argparse
import json
import logging
import sys
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import psycopg
from psycopg import sql
from werkzeug.serving import make_server

from app import create_app
from fingerprint import DuplicateMember, fingerprint

failures = []


def check(ok: bool, what: str):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)


def post(base, key, payload, user="alice"):
    req = urllib.request.Request(base + "/orders", data=json.dumps(payload).encode(), method="POST",
                                 headers={"Idempotency-Key": key, "X-User": user,
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--schema", required=True)
    p.add_argument("--vectors", required=True)
    p.add_argument("--drop-schema", action="store_true")
    a = p.parse_args()
    vectors(a.vectors)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)

    server = make_server("127.0.0.1", 0, create_app(a.url, a.schema), threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        payload = {"sku": "S-204", "quantity": 2}
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: post(base, "order-key-1", payload), range(8)))
        with psycopg.connect(a.url) as conn:
            (rows,) = conn.execute(sql.SQL("SELECT count(*) FROM {}.orders WHERE idem_key = %s")
                                   .format(sql.Identifier(a.schema)), ("order-key-1",)).fetchone()
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
    finally:
        server.shutdown()
        if a.drop_schema:
            with psycopg.connect(a.url, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(a.schema)))
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
