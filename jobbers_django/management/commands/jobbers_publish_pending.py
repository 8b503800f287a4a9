"""``manage.py jobbers_publish_pending``: publish resubmitted dead letters whose publish never
ran (the process died after the commit, or Redis was down), and start a new step chain for a
paced resubmit that has had no step for a minute (``runs.revive``). Safe to run any time, from
cron or a beat schedule: each task is published at most once (jobbers' compare-and-set step),
and each entry at most once per run."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from jobbers_django.dlq import runs
from jobbers_django.dlq.actions import publish_pending


class Command(BaseCommand):
    help = "Publish resubmitted dead-letter entries whose publish never ran."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--older-than", type=float, default=30.0, metavar="SECONDS",
                            help="only entries resubmitted at least this long ago "
                                 "(default 30: leave in-flight requests alone)")

    def handle(self, *args: Any, **options: Any) -> None:
        published = publish_pending(timedelta(seconds=options["older_than"]))
        self.stdout.write(f"published {published} pending resubmit(s)")
        revived = runs.revive()
        if revived:
            self.stdout.write("restarted the steps of paced resubmit(s) "
                              + ", ".join(f"#{r}" for r in revived))
