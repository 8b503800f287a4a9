"""WSGI entry point (``gunicorn example.wsgi``); the example itself uses ``runserver``."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example.settings")
application = get_wsgi_application()
