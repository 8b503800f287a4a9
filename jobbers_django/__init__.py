"""jobbers_django: the dead-letter queue in Django, with admin triage pages and a REST API.

Add ``"jobbers_django"`` to ``INSTALLED_APPS`` (its app label is ``jobbers``), set
``jobbers_dead_letter_sink = "jobbers_django.sink.DjangoDeadLetterSink"`` in the Celery
configuration, and mount ``path("jobbers/", include("jobbers_django.urls"))``.
"""
