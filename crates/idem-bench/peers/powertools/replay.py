"""Single-caller replays through AWS Lambda Powertools' idempotency utility on Redis.

One idempotent function (Powertools' `idempotent_function` with its Redis persistence
layer, local cache off, as it ships) is called once to execute, then called again with
the same payload, back to back, for the given time: every later call is a replay read
from Redis. Prints one JSON object: calls, seconds, per_second. Keys live under the
given prefix; the caller removes them.
"""

import argparse
import json
import time

import redis
from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
    RedisCachePersistenceLayer,
)

BODY = {"user_id": "U-7318", "show_id": "S-204", "seats": 2}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args()

    client = redis.Redis.from_url(args.redis_url)
    persistence = RedisCachePersistenceLayer(client=client)
    config = IdempotencyConfig(expires_after_seconds=3600)

    @idempotent_function(
        data_keyword_argument="order",
        persistence_store=persistence,
        config=config,
        key_prefix=args.prefix,
    )
    def create_order(order: dict) -> dict:
        return {"order_id": "O-1", "status": "PENDING_PAYMENT", "request": order}

    first = create_order(order=BODY)
    calls = 0
    started = time.perf_counter()
    deadline = started + args.seconds
    while time.perf_counter() < deadline:
        if create_order(order=BODY) != first:
            raise SystemExit("a replay answered differently from the execution")
        calls += 1
    elapsed = time.perf_counter() - started
    print(json.dumps({"calls": calls, "seconds": elapsed, "per_second": calls / elapsed}))


if __name__ == "__main__":
    main()
