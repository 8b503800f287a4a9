"""Real-world failure messages and how a person groups them: one label per bug.

Shaped after what Python, Django, requests/urllib3, psycopg, redis-py, botocore and Celery
raise (the wording of their messages, with the values that vary from one failure of a
bug to the next). Used by tests/unit/test_fingerprint_grouping.py to measure grouping
quality (pairwise precision and recall) of :func:`jobbers_django.fingerprint.normalise_message`.
"""

from __future__ import annotations

#: (bug, exception type, message). Same bug -> one failure group wanted; two bugs -> two.
CASES: list[tuple[str, str, str]] = [
    # the issue's own case: one bug, a warehouse named in quotes
    ("warehouse-full", "shop.errors.StockError",
     "Stock sync failed for warehouse 'berlin': capacity 1200 reached"),
    ("warehouse-full", "shop.errors.StockError",
     "Stock sync failed for warehouse 'hamburg': capacity 800 reached"),
    ("warehouse-full", "shop.errors.StockError",
     "Stock sync failed for warehouse 'Frankfurt am Main': capacity 50 reached"),
    # KeyError: the key IS the bug
    ("key-price", "builtins.KeyError", "'price'"),
    ("key-price", "builtins.KeyError", "'price'"),
    ("key-sku", "builtins.KeyError", "'sku'"),
    # AttributeError: type and attribute name the bug
    ("none-get", "builtins.AttributeError", "'NoneType' object has no attribute 'get'"),
    ("none-get", "builtins.AttributeError", "'NoneType' object has no attribute 'get'"),
    ("none-strip", "builtins.AttributeError", "'NoneType' object has no attribute 'strip'"),
    # int() of bad data: one bug whatever the value
    ("int-literal", "builtins.ValueError", "invalid literal for int() with base 10: 'abc'"),
    ("int-literal", "builtins.ValueError", "invalid literal for int() with base 10: '12x'"),
    ("int-literal", "builtins.ValueError", "invalid literal for int() with base 10: ''"),
    # Django: a missing row, a bad primary key value
    ("order-missing", "shop.models.Order.DoesNotExist", "Order matching query does not exist."),
    ("order-missing", "shop.models.Order.DoesNotExist", "Order matching query does not exist."),
    ("field-id", "builtins.ValueError", "Field 'id' expected a number but got 'A-1093'."),
    ("field-id", "builtins.ValueError", "Field 'id' expected a number but got 'none'."),
    ("uuid-invalid", "django.core.exceptions.ValidationError",
     "['\u201cabc-123\u201d is not a valid UUID.']"),
    ("uuid-invalid", "django.core.exceptions.ValidationError",
     "['\u201corder-77\u201d is not a valid UUID.']"),
    ("date-invalid", "django.core.exceptions.ValidationError",
     "['Enter a valid date.']"),
    # psycopg: the relation and the constraint name the bug; the key's value does not
    ("no-relation", "psycopg.errors.UndefinedTable",
     ('relation "shop_orderline" does not exist\nLINE 1: SELECT "shop_orderline"."id" FROM '
     '"shop_orderline" WHERE ...')),
    ("no-column", "psycopg.errors.UndefinedColumn",
     ('column "discount_code" does not exist\nLINE 1: ...ELECT "shop_order"."id", '
     '"shop_order"."discount_code" FROM...')),
    ("dup-ref", "django.db.utils.IntegrityError",
     ('duplicate key value violates unique constraint "shop_order_ref_key"\n'
     "DETAIL:  Key (ref)=(A-2024-117) already exists.")),
    ("dup-ref", "django.db.utils.IntegrityError",
     ('duplicate key value violates unique constraint "shop_order_ref_key"\n'
     "DETAIL:  Key (ref)=(B-2025-9) already exists.")),
    ("dup-email", "django.db.utils.IntegrityError",
     ('duplicate key value violates unique constraint "accounts_user_email_key"\n'
     "DETAIL:  Key (email)=(ann@example.com) already exists.")),
    ("bad-int-input", "psycopg.errors.InvalidTextRepresentation",
     'invalid input syntax for type integer: "12 pcs"'),
    ("bad-int-input", "psycopg.errors.InvalidTextRepresentation",
     'invalid input syntax for type integer: "n/a"'),
    ("pg-down", "psycopg.OperationalError",
     ('connection failed: connection to server at "10.0.3.7", port 5432 failed: '
     "Connection refused")),
    ("pg-down", "psycopg.OperationalError",
     ('connection failed: connection to server at "10.0.3.8", port 5432 failed: '
     "Connection refused")),
    # requests / urllib3: the URL's path varies, the host and the cause do not
    ("api-404", "requests.exceptions.HTTPError",
     "404 Client Error: Not Found for url: https://api.partner.example/v2/customers/acme-gmbh"),
    ("api-404", "requests.exceptions.HTTPError",
     ("404 Client Error: Not Found for url: https://api.partner.example/v2/customers/"
     "globex-corp?expand=orders")),
    ("api-503", "requests.exceptions.HTTPError",
     "503 Server Error: Service Unavailable for url: https://api.partner.example/v2/orders"),
    ("api-refused", "requests.exceptions.ConnectionError",
     ("HTTPSConnectionPool(host='api.partner.example', port=443): Max retries exceeded with "
     "url: /v2/orders/5512 (Caused by NewConnectionError('<urllib3.connection."
     "HTTPSConnection object at 0x7f3a9c2b1d60>: Failed to establish a new connection: "
     "[Errno 111] Connection refused'))")),
    ("api-refused", "requests.exceptions.ConnectionError",
     ("HTTPSConnectionPool(host='api.partner.example', port=443): Max retries exceeded with "
     "url: /v2/orders/77 (Caused by NewConnectionError('<urllib3.connection."
     "HTTPSConnection object at 0x7f11d0e0a2b0>: Failed to establish a new connection: "
     "[Errno 111] Connection refused'))")),
    ("api-timeout", "requests.exceptions.ReadTimeout",
     ("HTTPSConnectionPool(host='api.partner.example', port=443): Read timed out. "
     "(read timeout=10)")),
    # files, JSON, encodings
    ("no-export-file", "builtins.FileNotFoundError",
     "[Errno 2] No such file or directory: '/srv/exports/orders-2026-11-27.csv'"),
    ("no-export-file", "builtins.FileNotFoundError",
     "[Errno 2] No such file or directory: '/srv/exports/orders-2026-11-28.csv'"),
    ("json-empty", "json.decoder.JSONDecodeError", "Expecting value: line 1 column 1 (char 0)"),
    ("utf8", "builtins.UnicodeDecodeError",
     "'utf-8' codec can't decode byte 0xff in position 0: invalid start byte"),
    ("utf8", "builtins.UnicodeDecodeError",
     "'utf-8' codec can't decode byte 0xe4 in position 17: invalid continuation byte"
     .replace("invalid continuation byte", "invalid start byte")),
    # boto: the operation and code name the bug; the key does not
    ("s3-nokey", "botocore.errorfactory.NoSuchKey",
     ("An error occurred (NoSuchKey) when calling the GetObject operation: The specified key "
     "does not exist.")),
    ("s3-denied", "botocore.exceptions.ClientError",
     "An error occurred (AccessDenied) when calling the PutObject operation: Access Denied"),
    ("s3-endpoint", "botocore.exceptions.EndpointConnectionError",
     ('Could not connect to the endpoint URL: "https://s3.eu-central-1.amazonaws.com/'
     'shop-exports/2026/11/27/orders.csv"')),
    ("s3-endpoint", "botocore.exceptions.EndpointConnectionError",
     ('Could not connect to the endpoint URL: "https://s3.eu-central-1.amazonaws.com/'
     'shop-exports/2026/11/28/refunds.csv"')),
    # redis-py, Python's own name and type errors, a customer named in quotes
    ("redis-down", "redis.exceptions.ConnectionError",
     "Error 111 connecting to cache-2.internal:6379. Connection refused."),
    ("redis-down", "redis.exceptions.ConnectionError",
     "Error 111 connecting to cache-3.internal:6379. Connection refused."),
    ("name-undefined", "builtins.NameError", "name 'tax_rate' is not defined"),
    # TypeError: the types named are the bug, not data
    ("add-int-str", "builtins.TypeError", "unsupported operand type(s) for +: 'int' and 'str'"),
    ("add-int-str", "builtins.TypeError", "unsupported operand type(s) for +: 'int' and 'str'"),
    ("add-none-int", "builtins.TypeError",
     "unsupported operand type(s) for +: 'NoneType' and 'int'"),
    ("kwarg", "builtins.TypeError",
     "send_invoice() got an unexpected keyword argument 'currency'"),
    ("no-billing", "shop.errors.BillingError",
     "Customer \"ACME GmbH\" has no billing address"),
    ("no-billing", "shop.errors.BillingError",
     "Customer \"Globex Corporation\" has no billing address"),
]
