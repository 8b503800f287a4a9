"""The example's shop app: Celery tasks that take every path jobbers knows."""
