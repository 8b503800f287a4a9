"""The task and workflow pages of an id with nothing to show answer as the REST API does: a
404 saying jobbers knows nothing of it (not a 200 reading as an expired record), a 400 for an
id no task can have (longer than 4096 characters, not UTF-8), and a 403 first for who may not
read tasks at all."""

from __future__ import annotations

import pytest
from django.urls import reverse

pytestmark = pytest.mark.django_db

EXPIRED = "There is no record of this task in Redis any more"


@pytest.fixture(autouse=True)
def _redis(djapp):
    """The pages read Redis: the private one, flushed per test."""


@pytest.mark.parametrize("name", ["admin:jobbers_task", "admin:jobbers_workflow"])
def test_an_unknown_id_is_a_404_saying_so(client, staff, name):
    client.force_login(staff)
    response = client.get(reverse(name, args=["no-such-task-7f3a"]))
    assert response.status_code == 404
    page = response.content.decode()
    assert 'id="jobbers-no-task"' in page
    assert "no-such-task-7f3a" in page
    assert ("jobbers has no record of this task and no dead-letter entry" in page
            or "No workflow has this id" in page)
    assert EXPIRED not in page


@pytest.mark.parametrize("name", ["admin:jobbers_task", "admin:jobbers_workflow"])
@pytest.mark.parametrize(("task_id", "said"), [
    ("x" * 4097, "task id of 4097 characters: at most 4096 characters"),
    ("a\ud800b", "is not UTF-8: it names no task"),
])
def test_an_id_no_task_can_have_is_a_400_saying_why(client, staff, name, task_id, said):
    client.force_login(staff)
    response = client.get(reverse(name, args=[task_id]))
    assert response.status_code == 400
    page = response.content.decode()
    assert "<title>Not a task id |" in page
    assert said in page
    assert len(page) < 20_000  # the id is shown cut in the title, whole once on the page


def test_an_id_with_only_its_dead_letter_entry_is_its_page(client, staff, make_entries):
    [task_id] = make_entries(1)
    client.force_login(staff)
    response = client.get(reverse("admin:jobbers_task", args=[task_id]))
    assert response.status_code == 200
    assert EXPIRED in response.content.decode()  # the record expired; the entry is there


def test_who_may_not_read_tasks_gets_403_whatever_the_id(client, django_user_model):
    blind = django_user_model.objects.create_user("blind", password="pw", is_staff=True)
    client.force_login(blind)  # in the admin, without the dead letters' view permission
    for task_id in ("no-such-task", "x" * 4097):
        assert client.get(reverse("admin:jobbers_task", args=[task_id])).status_code == 403
