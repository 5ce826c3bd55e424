"""Per-run permissions on every page (issue 20).

Every URL in the URL conf has a row in ACCESS saying who may reach it; the sweep visits
each with each persona and checks the rule, so a page added without a rule fails here.
Personas: anonymous, the run's owner, an annotator of the run, a viewer of the run, and an
annotator of another run (an outsider to this one)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from apps.envapi.services import api_key_create
from apps.evaluation.models import Evaluation
from apps.feedback.models import Assignment
from apps.feedback.kinds.rating import feedback_rate
from apps.rewards.models import RewardModel
from apps.runs.heartbeat import task_run_id, worker_heartbeat_record
from apps.runs.invitations import invitation_create
from apps.runs.models import ModelVersion, Run, RunMember
from tests.factories import add_member, make_experiences, make_run, make_taskset, make_user
from tests.servers import EVENT_WAIT_S

pytestmark = pytest.mark.django_db

PUBLIC = "public"  # anyone, logged in or not
API = "api"  # the environment API: a bearer key, never a browser session
LOGIN = "login"  # any logged-in user; shows only what that user may see
MEMBER = "member"  # the run's people (owner, annotator, viewer); 404 to others
ANNOTATE = "annotate"  # the run's owner and annotators; 403 to its viewers, 404 to others
OWNER = "owner"  # the run's owner (or staff); 403 to its other people, 404 to others
STAFF = "staff"  # the admin site, and the accounts page
TOKEN = "token"  # anyone who holds the link's token (an invitation, a password reset): no login asked
VOTE = "vote"  # the blind vote page: signed in, and its evaluation's voters; 404 for a token that is none

ACCESS: dict[str, str] = {
    "": PUBLIC,  # redirects to the runs list
    "login": PUBLIC,
    "logout": PUBLIC,
    "invitation": TOKEN,
    "password_reset": PUBLIC,
    "password_reset_done": PUBLIC,
    "password_reset_confirm": TOKEN,
    "password_reset_complete": PUBLIC,
    "accounts": STAFF,
    "account_active": STAFF,
    "favicon.ico": PUBLIC,  # a redirect to the static icon
    "health": PUBLIC,
    "ready": PUBLIC,  # readiness: which dependency is down, nothing of any run
    "^static/(?P<path>.*)$": PUBLIC,  # only while DEBUG is on
    "admin:login": PUBLIC,
    "admin:logout": PUBLIC,
    "envapi-v1:openapi-json": PUBLIC,
    "envapi-v1:openapi-view": PUBLIC,
    "envapi-v1:api-root": API,
    "envapi-v1:runs_list": API,
    "envapi-v1:run_get": API,
    "envapi-v1:run_taskset_get": API,
    "envapi-v1:annotation_get": API,
    "envapi-v1:tasks_claim": API,
    "envapi-v1:tasks_release": API,
    "envapi-v1:tasks_finish": API,
    "envapi-v1:tasks_create": API,
    "envapi-v1:trajectories_create": API,
    "envapi-v1:feedback_create": API,
    "envapi-v1:feedback_get": API,  # a label and its ledger state
    "envapi-v1:run_labels_ledger": API,
    "envapi-v1:run_evaluation": API,
    "envapi-v1:rollouts_create": API,
    "envapi-v1:run_events": API,
    "envapi-v1:run_export": API,
    "envapi-v1:session_finish": API,
    # The OpenAI-compatible endpoint (apps/envapi/openai_api.py): a run's bearer key.
    "openai-chat": API,
    "openai-completions": API,
    "openai-models": API,
    "api/v1/runs/<int:run_id>/openai/v1/<path:rest>": API,  # an OpenAI-shaped 404 for other paths
    "runs:list": LOGIN,
    "runs:new": LOGIN,
    "runs:workers": LOGIN,
    "runs:detail": MEMBER,
    "runs:metrics": MEMBER,
    "runs:summary": MEMBER,
    "runs:versions": MEMBER,  # every version and the best by a metric picked there (issue 64)
    "runs:headline": MEMBER,
    "runs:diff": MEMBER,  # the config diff: both runs must be visible (the other is checked in tests/dashboard/test_config_diff.py)
    "runs:diff_with": MEMBER,
    "runs:weights_prepare": MEMBER,  # the run's people may ask for and download its weights
    "runs:weights_download": MEMBER,
    "runs:controls": MEMBER,
    "runs:control": OWNER,
    "runs:twin": OWNER,
    "runs:feedback_settings": OWNER,
    "runs:feedback_settings_moved": OWNER,  # the old path: a 308 to the owner, a 404 to the rest
    "runs:timeline": MEMBER,
    "runs:ledger": MEMBER,  # "Where the labels went", refreshed live on the run page
    "runs:audit": MEMBER,
    "runs:experiences": MEMBER,
    "runs:group": MEMBER,
    "runs:export": MEMBER,
    "runs:export_download": MEMBER,
    "runs:image": MEMBER,  # a picture of the run's taskset (apps/buffer/views.py)
    "runs:failures": MEMBER,
    "runs:waiting": MEMBER,
    "runs:labelling": OWNER,  # the owner's labelling progress panel, refreshed live on the run page
    "runs:taskset_import": MEMBER,
    "runs:members": MEMBER,  # GET lists the people; adding one is the owner's (POST)
    "runs:member_remove": OWNER,
    "runs:invitations": OWNER,
    "runs:invitation_revoke": OWNER,
    "feedback:page": MEMBER,
    "feedback:queue": ANNOTATE,
    "feedback:counts": MEMBER,
    "feedback:ledger": MEMBER,  # the annotation page's "Where the labels went", refreshed live
    "feedback:rate": ANNOTATE,
    "feedback:skip": ANNOTATE,
    "feedback:edit": ANNOTATE,
    "feedback:rank": ANNOTATE,
    "feedback:compare": ANNOTATE,
    "feedback:panel": ANNOTATE,  # a feedback kind's panel, at its slug (apps/feedback/kinds)
    "feedback:mine": ANNOTATE,
    "feedback:revise": ANNOTATE,  # revise one of my labels in place (a label not theirs: 400)
    "review:page": OWNER,  # the review of labels (apps/feedback/review/views.py)
    "review:accept": OWNER,
    "review:reject": OWNER,
    "review:resolve": OWNER,
    "envapi-v1:review_labels_list": API,
    "envapi-v1:review_label_accept": API,
    "envapi-v1:review_label_reject": API,
    "envapi-v1:review_disagreements_list": API,
    "envapi-v1:review_disagreement_resolve": API,
    "rewards:raters": OWNER,
    "rewards:raters_json": OWNER,
    "rewards:reward_model": MEMBER,
    "rewards:reward_model_export": OWNER,
    "rewards:reward_model_download": OWNER,
    "rewards:preferences": OWNER,
    "envapi-v1:raters_get": API,
    "envapi-v1:reward_models_list": API,
    "envapi-v1:reward_model_export_post": API,
    "envapi-v1:reward_model_export_get": API,
    "envapi-v1:reward_model_export_zip": API,
    "envapi-v1:k12_graders_list": API,
    "envapi:run-keys": OWNER,
    # A run's end told to its people (apps/control/notifications.py): each person's own list.
    "notifications": LOGIN,
    "notifications_read": LOGIN,
    "notifications_badge": LOGIN,
    "notifications_email": MEMBER,  # the person's email choice for a run they are on
    # A person's own account (rftweb/account.py): their email, password, keys.
    "account": LOGIN,
    "password_change": LOGIN,
    "password_change_done": LOGIN,
    # Bulk actions (apps/feedback/bulk.py): the service checks each action's role (exclude and
    # include the owner's, flag an annotator's too), tests/dashboard/test_bulk_actions.py.
    "runs:experiences_bulk": MEMBER,
    "envapi-v1:experiences_bulk_api": API,
    "envapi:run-key-revoke": OWNER,
    "evaluation:vote": VOTE,  # blind evaluations (apps/evaluation): the vote page names no run
    "evaluation:vote_submit": VOTE,
    "evaluation_owner:create": OWNER,
    "evaluation_owner:close": OWNER,
    "evaluation_owner:export": OWNER,
    "envapi-v1:evaluation_create_api": API,
    "envapi-v1:evaluations_list_api": API,
    "envapi-v1:evaluation_next_api": API,
    "envapi-v1:evaluation_vote_api": API,
    "envapi-v1:evaluation_close_api": API,
    "envapi-v1:evaluation_figures_api": API,
    "envapi-v1:evaluation_export_api": API,
}
# The admin site guards all of its pages (staff only) by construction.
STAFF_PREFIXES = ("admin:", "admin/")

PERSONAS = ("anonymous", "owner", "annotator", "viewer", "other_annotator")


def _patterns(patterns: list[Any], namespaces: list[str], prefix: str) -> Iterator[tuple[str, str, URLPattern]]:
    for p in patterns:
        if isinstance(p, URLResolver):
            yield from _patterns(p.url_patterns, namespaces + ([p.namespace] if p.namespace else []), prefix + str(p.pattern))
        else:
            route = prefix + str(p.pattern)
            yield (":".join([*namespaces, p.name]) if p.name else route), route, p


def all_urls() -> list[tuple[str, str, URLPattern]]:
    return list(_patterns(get_resolver().url_patterns, [], ""))


def rule_of(key: str) -> str | None:
    if key in ACCESS:
        return ACCESS[key]
    return STAFF if key.startswith(STAFF_PREFIXES) else None


def test_every_url_in_the_url_conf_has_an_access_rule() -> None:
    missing = [key for key, _, _ in all_urls() if rule_of(key) is None]
    assert missing == [], f"add these to ACCESS in {__file__}: {missing}"


def test_the_access_table_names_no_url_that_is_gone() -> None:
    keys = {key for key, _, _ in all_urls()}
    assert [k for k in ACCESS if k not in keys and not k.startswith("^static")] == []


@pytest.fixture
def world() -> dict[str, Any]:
    owner = make_user("owner")
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), name="secret run")
    annotator, viewer, other = make_user("annotator"), make_user("viewer"), make_user("other")
    add_member(run, annotator)
    add_member(run, viewer, RunMember.Role.VIEWER)
    other_run = make_run(owner=make_user("other-owner"), name="other run")
    add_member(other_run, other)
    experiences = make_experiences(run, groups=1, group_size=2)
    assignments = {
        user.username: Assignment.objects.create(run=run, experience=experiences[0], annotator=user, slot=i)
        for i, user in enumerate((owner, annotator))
    }
    key, _ = api_key_create(name="env", runs=[run], actions=["read"], rate_limit_per_minute=100)
    member = RunMember.objects.get(run=run, user=viewer)
    image = _taskset_picture(run)
    RewardModel.objects.create(run=run, version=1, path="/nowhere/v1", base="demo", accuracy=0.9)
    ModelVersion.objects.create(run=run, number=1, checkpoint="/nowhere/model-v1", train_step=1)
    invitation = invitation_create(run=run, role="annotator", actor=owner).invitation
    label = feedback_rate(run=run, experience=experiences[0], score=2, author=annotator)
    evaluation = Evaluation.objects.create(run=run, token="an-evaluation", seed=1, votes_per_pair=1)
    return {"run": run, "evaluation": evaluation, "experience": experiences[0], "assignments": assignments, "key": key, "member": member,
            "label": label,
            "image": image, "invitation": invitation, "users": {"owner": owner, "annotator": annotator, "viewer": viewer, "other_annotator": other}}


def _taskset_picture(run: Run) -> str:
    """A picture of the run's taskset, in the image store: the digest the image URL names."""
    from apps.buffer.images import image_store
    from apps.buffer.models import TasksetImage
    from tests.factories import picture_png, taskset_of

    info = image_store(data=picture_png(2), name="two.png")
    TasksetImage.objects.create(taskset=taskset_of(run), sha256=info.sha256, content_type=info.content_type, width=info.width,
                                height=info.height, size=info.size, name=info.name)
    return info.sha256


def _url(key: str, route: str, pattern: URLPattern, world: dict[str, Any], persona: str) -> str | None:
    params = set(re.findall(r"<(?:\w+:)?(\w+)>|\(\?P<(\w+)>", route))
    params = {a or b for a, b in params}
    if key.startswith("^static") or key.endswith("(?P<url>.*)$"):
        return None  # file serving and the admin's catch-all redirect: nothing of a run's
    values = {
        "run_id": world["run"].pk, "experience_id": world["experience"].pk, "group_id": world["experience"].group_id,
        "assignment_id": world["assignments"].get(persona, world["assignments"]["annotator"]).pk,
        "key_id": world["key"].pk, "member_id": world["member"].pk, "action": "pause", "export_format": "sft", "format": "sft", "rest": "nothing-here", "name": "a-session",
        "slug": "rank",
        "object_id": world["run"].pk, "app_label": "runs", "content_type_id": 1, "id": world["users"]["owner"].pk,
        "sha256": world["image"], "version": 1, "invitation_id": world["invitation"].pk, "token": "not-a-token",
        "uidb64": "MQ", "user_id": world["users"]["owner"].pk,
        "other_id": world["run"].pk, "feedback_id": world["label"].pk,
        "evaluation_id": world["evaluation"].pk, "item": "not-an-item",
    }
    kwargs = {name: values[name] for name in params}
    if pattern.name:
        return reverse(key, kwargs=kwargs)
    return "/" + route.replace("<path:object_id>", str(world["run"].pk))


def _visit(client: Client, url: str) -> Any:
    response = client.get(url)
    if response.status_code == 405:
        response = client.post(url, {})
    return response


def _to_login(response: Any) -> bool:
    return response.status_code == 302 and "login" in response["Location"]


def _expect(rule: str, persona: str, response: Any, url: str) -> None:
    status = response.status_code
    where = f"{persona} at {url}: {status}"
    if rule == PUBLIC:
        assert status < 400 or status == 405, where
    elif rule == VOTE:
        assert _to_login(response) if persona == "anonymous" else status == 404, where
    elif rule == TOKEN:
        assert status < 500 and status != 403 and not _to_login(response), where
    elif rule == API:
        assert status in (401, 404), where  # a session is not a key
    elif rule == STAFF:
        assert _to_login(response), where  # no persona here is staff
    elif persona == "anonymous":
        assert _to_login(response), where
    elif rule == LOGIN:
        assert status in (200, 302), where
    elif persona == "other_annotator":
        assert status == 404, where  # no hint that the run exists
    elif rule == MEMBER or (rule == ANNOTATE and persona != "viewer") or (rule == OWNER and persona == "owner"):
        assert status not in (401, 403, 404) and not _to_login(response) and status < 500, where
    else:
        assert status == 403, where


@pytest.mark.parametrize("persona", PERSONAS)
def test_every_url_keeps_to_its_rule_for_each_persona(world: dict[str, Any], persona: str) -> None:
    client = Client()
    checked = 0
    for key, route, pattern in all_urls():
        url = _url(key, route, pattern, world, persona)
        if url is None:
            continue
        if persona != "anonymous":
            client.force_login(world["users"][persona])  # again: one of the URLs logs out
        rule = rule_of(key)
        assert rule is not None, f"{key} has no access rule"  # the rule-per-URL test says which
        _expect(rule, persona, _visit(client, url), url)
        checked += 1
    assert checked > 50


def test_a_runs_urls_never_reach_another_runs_objects(world: dict[str, Any]) -> None:
    """The owner of this run, at this run's URLs, with ids of another run's experience,
    group, assignment or key: 404, as if they did not exist."""
    owner = world["users"]["owner"]
    elsewhere = make_run(owner=owner, name="owner's other run")
    foreign = make_experiences(elsewhere, groups=1, group_size=2)[0]
    foreign_key, _ = api_key_create(name="other", runs=[elsewhere], actions=["read"], rate_limit_per_minute=100)
    foreign_ids = {
        "experience_id": foreign.pk, "group_id": foreign.group_id, "key_id": foreign_key.pk,
        "member_id": RunMember.objects.create(run=elsewhere, user=make_user("elsewhere"), role=RunMember.Role.VIEWER).pk,
        "assignment_id": Assignment.objects.create(run=elsewhere, experience=foreign, annotator=owner, slot=0).pk,
        "feedback_id": feedback_rate(run=elsewhere, experience=foreign, score=3, author=owner).pk,
    }
    client = Client()
    client.force_login(owner)
    checked = 0
    for key, route, pattern in all_urls():
        names = {a or b for a, b in re.findall(r"<(?:\w+:)?(\w+)>|\(\?P<(\w+)>", route)}
        if not pattern.name or "run_id" not in names or not names & set(foreign_ids) or rule_of(key) == API:
            continue
        values = {"run_id": world["run"].pk, "action": "pause", "export_format": "sft", "slug": "rank", **foreign_ids}
        kwargs = {n: values[n] for n in names}
        url = reverse(key, kwargs=kwargs)
        response = _visit(client, url)
        assert response.status_code == 404, f"{url}: {response.status_code}"
        checked += 1
    assert checked >= 10


# --- the workers page (the leak the issue found) ----------------------------------------------

def test_a_task_is_recorded_by_its_run_not_its_arguments() -> None:
    import apps.control.tasks  # noqa: F401 - registers the tasks, as a worker does
    import workers.explore.explorer
    import workers.trainer.task  # noqa: F401

    assert task_run_id(name="workers.explore.explorer.generate", args=[7, [{"prompt": "secret"}]], kwargs={}) == 7
    # Bound tasks (self first) too: the run, not the step.
    assert task_run_id(name="workers.explore.explorer.explore_step", args=[3, 9], kwargs={}) == 3
    assert task_run_id(name="workers.trainer.task.train_step", args=[4, 9], kwargs={}) == 4
    assert task_run_id(name="apps.control.tasks.run_announce", args=[5], kwargs={}) == 5
    assert task_run_id(name="workers.explore.explorer.explore_step", args=[], kwargs={"run_id": 3, "step": 1}) == 3
    assert task_run_id(name="apps.buffer.tasks.lease_reap_task", args=[], kwargs={}) is None


def test_the_workers_page_shows_a_runs_tasks_to_its_people_only_and_never_arguments(world: dict[str, Any]) -> None:
    run = world["run"]
    worker_heartbeat_record(
        hostname="rollout@gpu1", queues=["rollout"], pool="solo", concurrency=1, pid=1,
        active=[{"id": "t1", "name": "workers.explore.explorer.generate", "run_id": run.pk,
                 # A heartbeat from before this change still holds the raw arguments.
                 "args": "(1, [{'prompt': 'the secret prompt', 'n': 16}])", "started_at": None}],
    )
    pages = {}
    for persona in ("owner", "annotator", "viewer", "other_annotator"):
        client = Client()
        client.force_login(world["users"][persona])
        pages[persona] = client.get("/runs/workers/").content.decode()
        assert "the secret prompt" not in pages[persona]
        assert "rollout@gpu1" in pages[persona]  # worker health itself is not a run's secret
    for persona in ("owner", "annotator", "viewer"):
        assert "workers.explore.explorer.generate" in pages[persona] and f"/runs/{run.pk}/" in pages[persona]
    assert "workers.explore.explorer.generate" not in pages["other_annotator"]
    assert f"/runs/{run.pk}/" not in pages["other_annotator"]
    assert "1 task of other runs" in pages["other_annotator"]

    client = Client()
    client.force_login(world["users"]["owner"])
    detail = client.get(f"/runs/{run.pk}/").content.decode()
    assert "workers.explore.explorer.generate" in detail and "the secret prompt" not in detail


def test_an_outsider_gets_404_on_the_keys_page_like_on_every_run_page(world: dict[str, Any]) -> None:
    client = Client()
    client.force_login(world["users"]["other_annotator"])
    assert client.get(f"/runs/{world['run'].pk}/keys/").status_code == 404
    assert client.get(f"/runs/{world['run'].pk}/").status_code == 404


# --- websockets: the same rules on the live stream ---------------------------------------------

WEBSOCKET_ACCESS: dict[str, str] = {"ws/runs/<int:run_id>/": MEMBER, "ws/runs/": LOGIN}


def test_every_websocket_route_has_an_access_rule() -> None:
    from rftweb.routing import websocket_urlpatterns

    assert {str(p.pattern) for p in websocket_urlpatterns} == set(WEBSOCKET_ACCESS)


def _secret_run_and_its_people() -> tuple[Run, dict[str, Any]]:
    """A run with its owner, an annotator and a viewer, and an annotator of another run."""
    owner = make_user("owner")
    run = make_run(owner=owner, name="secret run")
    annotator, viewer, other = make_user("annotator"), make_user("viewer"), make_user("other")
    add_member(run, annotator)
    add_member(run, viewer, RunMember.Role.VIEWER)
    add_member(make_run(owner=make_user("other-owner"), name="other run"), other)
    return run, {"owner": owner, "annotator": annotator, "viewer": viewer, "other_annotator": other}


@pytest.mark.django_db(transaction=True)
async def test_the_live_stream_keeps_to_its_rule_for_each_persona() -> None:
    from asgiref.sync import sync_to_async
    from channels.routing import URLRouter
    from channels.testing import WebsocketCommunicator
    from django.contrib.auth.models import AnonymousUser

    from rftweb.routing import websocket_urlpatterns

    run, users = await sync_to_async(_secret_run_and_its_people)()
    users["anonymous"] = AnonymousUser()
    allowed = {"owner", "annotator", "viewer"}
    for persona, user in users.items():
        comm = WebsocketCommunicator(URLRouter(websocket_urlpatterns), f"/ws/runs/{run.pk}/")
        comm.scope["user"] = user
        connected, _ = await comm.connect(timeout=EVENT_WAIT_S)  # a loaded host can take over a second
        assert connected == (persona in allowed), persona
        await comm.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_the_runs_list_socket_tells_each_persona_only_about_runs_they_may_see() -> None:
    from asgiref.sync import sync_to_async
    from channels.routing import URLRouter
    from channels.testing import WebsocketCommunicator
    from django.contrib.auth.models import AnonymousUser

    from apps.runs.events import runs_list_touch
    from apps.runs.services import run_member_remove
    from rftweb.routing import websocket_urlpatterns

    run, users = await sync_to_async(_secret_run_and_its_people)()
    refused = WebsocketCommunicator(URLRouter(websocket_urlpatterns), "/ws/runs/")
    refused.scope["user"] = AnonymousUser()
    assert (await refused.connect(timeout=EVENT_WAIT_S))[0] is False
    await refused.disconnect()  # its consumer ends here, not at the event loop's close
    sockets = {}
    for persona, user in users.items():
        comm = WebsocketCommunicator(URLRouter(websocket_urlpatterns), "/ws/runs/")
        comm.scope["user"] = user
        assert (await comm.connect(timeout=EVENT_WAIT_S))[0], persona
        sockets[persona] = comm
    try:
        runs_list_touch(run_id=run.pk)  # as any change to the run does, through the channel layer
        for persona in ("owner", "annotator", "viewer"):
            assert await sockets[persona].receive_json_from(timeout=EVENT_WAIT_S) == {"type": "runs.changed",
                                                                            "payload": {"run": run.pk}}, persona
        assert await sockets["other_annotator"].receive_nothing(timeout=1)
        # Taken off the run: told once more (their page drops the row), then never again.
        member = await sync_to_async(lambda: run.members.get(user=users["annotator"]))()
        await sync_to_async(run_member_remove)(run=run, member_id=member.pk)
        assert (await sockets["annotator"].receive_json_from(timeout=EVENT_WAIT_S))["payload"] == {"run": run.pk}
        await sync_to_async(runs_list_touch)(run_id=run.pk)
        assert (await sockets["owner"].receive_json_from(timeout=EVENT_WAIT_S))["payload"] == {"run": run.pk}
        assert await sockets["annotator"].receive_nothing(timeout=2)
    finally:
        for comm in sockets.values():
            await comm.disconnect()
