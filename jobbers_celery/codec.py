"""The documented key one-liner, ``python -c "from jobbers_celery.codec import new_key;
print(new_key())"``; the codec lives in :mod:`jobbers_celery.core.codec`."""

from __future__ import annotations

from jobbers_celery.core.codec import new_key

__all__ = ["new_key"]
