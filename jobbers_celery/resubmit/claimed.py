"""Publish the claimed entries, settle the refused ones: how every resubmit front end (the
Redis sink's paced runs, the Django sink's resubmits and paced runs) hands dead letters it
has claimed to the resubmit path (``Jobbers.resubmit_dead_letters``, compare-and-set per
task) and learns which went out.

A claimed entry the resubmit path refused (its task is pending, running or finished already:
someone else resubmitted it) is settled by the caller's ``refused``; a publish call that
raises raises here, and settles nothing: each caller knows what a half-done publish leaves.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import TypeVar

from jobbers_celery.core.options import ResubmitVersion
from jobbers_celery.core.records import DeadLetter

__all__ = ["Publish", "publish_claimed"]

K = TypeVar("K", bound=Hashable)

#: The resubmit path: entries, reset_retry_count, version -> the task ids it published.
Publish = Callable[[list[DeadLetter], bool, ResubmitVersion], list[str]]


def publish_claimed(claimed: Mapping[K, DeadLetter], publish: Publish, *,
                    reset_retry_count: bool, version: ResubmitVersion | str,
                    refused: Callable[[list[K]], None]) -> list[K]:
    """Publish ``claimed`` (key -> entry) in one call, hand the keys of the entries it
    refused to ``refused``, and return the keys of those published."""
    if not claimed:
        return []
    done = set(publish(list(claimed.values()), reset_retry_count, ResubmitVersion(version)))
    went = [key for key, entry in claimed.items() if entry.task_id in done]
    left = [key for key, entry in claimed.items() if entry.task_id not in done]
    if left:
        refused(left)
    return went
