"""The example Django project: settings, URLs and the Celery app (``example.celery``)."""
