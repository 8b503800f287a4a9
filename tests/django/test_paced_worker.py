"""Paced resubmits with a real worker (``dj_worker``): a run whose cause is not fixed halts by
its stop rule; once the cause is fixed, a run (started by ``manage.py jobbers_dlq``) paused,
resumed, carried across a worker restart, completes with exact counts."""

from __future__ import annotations

import io
import uuid

import pytest
from django.core.management import call_command

from jobbers_celery import TaskState
from jobbers_django import runs
from jobbers_django.models import (
    Action,
    DeadLetterAudit,
    DeadLetterEntry,
    ItemOutcome,
    ResubmitRun,
    ResubmitRunItem,
    RunStatus,
    Status,
)
from tests.conftest import wait_for
from tests.django.api_helpers import API, login, post
from tests.django.conftest import start_dj_worker, stop_dj_worker

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

N = 40  # at 20 per second: 2 s to publish them all, a margin over the halt


def fresh(run_id: int) -> ResubmitRun:
    return ResubmitRun.objects.get(pk=run_id)


def settled(run: ResubmitRun) -> bool:
    """Every published item has its outcome."""
    return not ResubmitRunItem.objects.filter(run=run, published_at__isnull=False,
                                              outcome=ItemOutcome.PENDING).exists()


def test_unfixed_halts_fixed_completes_across_pause_and_restart(
        djapp, jobbers, dj_worker, operator, make_entries, tmp_path, capsys):
    key = f"djproj:paced:{uuid.uuid4().hex[:8]}"
    ids = make_entries(N, args=[key], kwargs={},
                       exception_message=f"upstream rejected row 17 of {key}")
    fingerprint = DeadLetterEntry.objects.get(task_id=ids[0]).fingerprint
    assert DeadLetterEntry.objects.filter(fingerprint=fingerprint).count() == N
    client = login(operator)

    # 1. the cause is not fixed: 20 per second, halt when more than 5 of the last 10 fail
    answer = post(client, "dead-letter-queue/resubmit",
                  {"fingerprint": fingerprint, "limit": 100, "rate": 20, "halt_after": 5,
                   "of_last": 10})
    assert answer.status_code == 202, answer.content
    halted_id = answer.json()["id"]
    run = wait_for(lambda: (r := fresh(halted_id)).status == RunStatus.HALTED and r,
                   timeout=30, interval=0.05, message="the unfixed run to halt")
    took = (run.finished_at - run.started_at).total_seconds()
    print(f"\nHALTED: rate 20/s, rule '{run.rule}', {run.published} of {run.total} published "
          f"before the halt, {run.failed_again} failed again, {took:.2f} s from first "
          f"publish to halt: {run.halt_reason}")
    assert 6 <= run.published < N
    assert run.failed_again > 5
    assert run.halt_reason.endswith("of the last 10 resubmitted tasks failed again (the "
                                    "rule: halt when more than 5 of the last 10)")
    shown = client.get(f"{API}/dead-letter-queue/resubmit-runs/{halted_id}").json()
    assert (shown["status"], shown["published"]) == ("halted", run.published)
    # the entries it did not publish were never touched
    untouched = DeadLetterEntry.objects.filter(resubmit_count=0)
    assert untouched.count() == N - run.published
    assert set(untouched.values_list("status", flat=True)) == {Status.DEAD}
    # what was in flight at the halt is still followed to its outcome
    wait_for(lambda: settled(fresh(halted_id)) and fresh(halted_id).failed_again
             == fresh(halted_id).published, timeout=30, message="the in-flight to fail again")
    wait_for(lambda: DeadLetterEntry.objects.filter(status=Status.DEAD).count() == N,
             timeout=20, message="every entry dead again")
    halt = DeadLetterAudit.objects.get(run_id=halted_id, action=Action.RUN_HALT)
    assert halt.detail == run.halt_reason
    assert halt.acted == run.published

    # 2. the fix is deployed; the command line starts a paced run over the same 40
    jobbers.store.client.set(key, "fixed")
    out = io.StringIO()
    call_command("jobbers_dlq", "resubmit", "--task", "djproj.flaky_import", "--rate", "20",
                 "--halt-after", "5", "--of-last", "10", stdout=out)
    assert out.getvalue().startswith("Started paced resubmit #")
    print(f"$ manage.py jobbers_dlq resubmit --task djproj.flaky_import --rate 20 "
          f"--halt-after 5 --of-last 10\n{out.getvalue()}")
    run_id = ResubmitRun.objects.exclude(pk=halted_id).get().pk
    assert fresh(run_id).total == N

    # paused: nothing more is published (the pause waits for a step holding the run)
    wait_for(lambda: fresh(run_id).published >= 3, timeout=20, message="3 published")
    paused = post(client, f"dead-letter-queue/resubmit-runs/{run_id}/pause", {})
    assert paused.status_code == 200, paused.content
    at_pause = fresh(run_id).published
    wait_for(lambda: settled(fresh(run_id)) and fresh(run_id).completed == at_pause,
             timeout=20, message="the published ones to complete")
    assert (fresh(run_id).status, fresh(run_id).published) == (RunStatus.PAUSED, at_pause)
    progress = io.StringIO()
    call_command("jobbers_dlq", "run", str(run_id), stdout=progress)
    print(f"$ manage.py jobbers_dlq run {run_id}\n{progress.getvalue()}")
    assert f"Paced resubmit #{run_id}: paused" in progress.getvalue()
    assert at_pause < N

    # resumed from the admin, then the worker restarts mid-run
    resumed = client.post(f"/admin/jobbers/resubmitrun/{run_id}/control/resume/")
    assert resumed.status_code == 302
    wait_for(lambda: fresh(run_id).published > at_pause, timeout=20,
             message="publishing again after the resume")
    stop_dj_worker(dj_worker)
    # the next step waits in jobbers' scheduler (or, if just published, at the broker)
    in_redis = sum(1 for r in jobbers.scheduled(limit=1000) if r.name == runs.STEP_TASK)
    before_restart = fresh(run_id).published
    second = start_dj_worker(djapp, tmp_path / "worker2.log")
    try:
        run = wait_for(lambda: (r := fresh(run_id)).status == RunStatus.DONE and r,
                       timeout=30, interval=0.05, message="the fixed run to be done")
    finally:
        stop_dj_worker(second)
    print(f"DONE: {run.published} published, {run.completed} completed, {run.failed_again} "
          f"failed again, {run.remaining} remaining; paused at {at_pause}, worker restarted "
          f"at {before_restart} (scheduled in Redis while down: {in_redis})")
    # every entry published once; each one completed, except (at most) the one task the
    # restart's warm shutdown interrupted (on_shutdown=stop: stalled and dead-lettered)
    assert (run.total, run.published, run.skipped, run.remaining) == (N, N, 0, 0)
    assert run.completed + run.failed_again == N
    interrupted = ResubmitRunItem.objects.filter(run_id=run_id,
                                                 outcome=ItemOutcome.FAILED_AGAIN)
    assert interrupted.count() <= 1
    for item in interrupted:
        assert jobbers.get(item.task_id).state == TaskState.STALLED
        assert DeadLetterEntry.objects.get(task_id=item.task_id).reason == "stalled"
    ids = [i for i in ids if i not in {item.task_id for item in interrupted}]
    assert all(jobbers.get(i).state == TaskState.COMPLETED for i in ids)
    # each entry published once by this run: resubmit_count is 1 + (1 if the halted run
    # published it)
    halted_ids = set(ResubmitRunItem.objects.filter(run_id=halted_id, published_at__isnull=False)
                     .values_list("task_id", flat=True))
    for task_id, count in DeadLetterEntry.objects.values_list("task_id", "resubmit_count"):
        assert count == 1 + (task_id in halted_ids)
    actions = list(DeadLetterAudit.objects.filter(run_id=run_id).order_by("at", "id")
                   .values_list("action", flat=True))
    assert actions == [Action.RUN_START, Action.RUN_PAUSE, Action.RUN_RESUME, Action.RUN_DONE]
    done = DeadLetterAudit.objects.get(run_id=run_id, action=Action.RUN_DONE)
    assert done.detail.startswith(f"{N} published: {run.completed} completed, "
                                  f"{run.failed_again} failed again")
