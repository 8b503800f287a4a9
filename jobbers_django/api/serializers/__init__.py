"""What the REST API reads and answers (docs/howto/rest-api.md), in three parts:
:mod:`~jobbers_django.api.serializers.fields` (task ids, UTC datetimes, redacted values, the
strict serializer), :mod:`~jobbers_django.api.serializers.requests` (query parameters and
bodies) and :mod:`~jobbers_django.api.serializers.responses` (answers).

Requests are validated strictly: unknown fields and query parameters, blank or repeated
values, task ids over ``TASK_ID_MAX_LENGTH`` characters and out-of-range limits are 400s
that name the field (an id is any string Celery runs: any character is accepted).
"""
