"""Issue 46, item 3: a ledger of every label. Labels given through the services every door
calls, groups trained through the trainer's own commit (batch_commit_step), a label rejected
on review, a group dropped, the run ended: each label lands in exactly one state, and the
pages (annotation page, run page, summary), the API (run and label endpoints) and the CLI
show the counts that are computed here again, independently, from the database rows.

Old code had no ledger (every page said "0 late"); these fail there on the missing module.

Issue 62, item 3: "taught the reward model" is a fact, not a timestamp. Reward-model versions
are published through the trainer's own recording path (`rm_publish`: the pairs it reads,
their labels, `reward_model_publish`), and the states here are derived from the recorded pair
rows (RewardModel.trained_on, held_out, unpaired), never from when a version read its data:
a lone rating, a gold item's, an untrusted rater's and a held-out label are not taught, even
with a version trained after them."""

from __future__ import annotations

import re
from collections import Counter
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import transaction
from django.test import Client

from apps.buffer.models import Experience
from apps.buffer.services import batch_claim, batch_commit_step
from apps.envapi.services import api_key_create
from apps.feedback.bulk import experiences_bulk
from apps.feedback.models import Feedback
from apps.feedback.review.services import feedback_reject
from apps.feedback.kinds.edit import feedback_edit
from apps.feedback.kinds.pairwise import feedback_compare
from apps.feedback.kinds.ranking import feedback_rank
from apps.feedback.kinds.rating import feedback_rate
from apps.feedback.reward_model.versions import reward_model_publish
from apps.feedback.reward_model.preferences import pair_labels, prompt_is_heldout
from apps.rewards.models import GoldItem, RewardModel
from apps.runs.ports import run_view_of
from apps.runs.models import ModelVersion, Run
from apps.runs.services import run_transition
from tests.factories import add_member, make_experiences, make_run, make_taskset, make_user

pytestmark = pytest.mark.django_db

LATE_STATUSES = ("leased", "consumed", "filtered")
HELDOUT_SHARE = 0.05
UNUSED = ("rejected", "heldout", "lone", "gold", "untrusted", "no_pair", "algorithm", "late", "filtered", "run_ended")


def rm_publish(run: Run) -> RewardModel:
    """A reward-model version as the trainer publishes one (workers.reward.trainer): the pairs
    it reads now, split by prompt, and the labels they came from recorded with it (the fit
    itself, which changes none of that, left out)."""
    from workers.reward.trainer import reward_model_pairs_read

    train, heldout, unpaired = reward_model_pairs_read(run=run_view_of(run))
    return reward_model_publish(run=run, path="/x/rm", base="b", accuracy=None, pairs_train=len(train),
                                pairs_heldout=len(heldout), labels=0, seconds=0.0,
                                pair_labels=pair_labels(train=train, heldout=heldout, unpaired=unpaired))


def _group(run: Run, size: int = 2, status: str = "pending") -> list[Experience]:
    return make_experiences(run, groups=1, group_size=size, status=status)


def _train(run: Run, step: int, group: list[Experience]) -> None:
    """As the trainer does: claim the group (ready, its hold over), commit step `step`, publish
    a version."""
    Experience.objects.filter(pk__in=[e.pk for e in group]).update(status="ready", reward=0.5, held_until=None)
    claimed = batch_claim(run=run, worker="trainer", size=len(group), group_complete=True)
    assert sorted(e.pk for e in claimed) == sorted(e.pk for e in group)
    with transaction.atomic():
        assert batch_commit_step(run=run, step=step, worker="trainer", ids=[e.pk for e in claimed], metrics={}) is None
    ModelVersion.objects.create(run=run, number=step, checkpoint=f"/x/v{step}", train_step=step)


@pytest.fixture
def labelled(owner: User, annotator: User) -> dict[str, Any]:
    """A GRPO run (blend) with a label in every state; returns the run and the ids by state."""
    bob = make_user("bob")
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), name="ledger", total_steps=5,
                   feedback={"mode": "blend"}, reward_model={"enabled": True, "heldout_share": HELDOUT_SHARE})
    add_member(run, annotator)
    add_member(run, bob)
    run_transition(run=run, action="start", actor=owner)
    expect: dict[int, tuple[str, str]] = {}
    # An A/B choice (GRPO trains on no pairs), then a reward-model version that trained on it
    # (its prompt is not in the held-out share).
    g_pair = _group(run)
    assert not prompt_is_heldout(g_pair[0].prompt_text, share=HELDOUT_SHARE, seed=run.cfg.seed)
    fb = feedback_compare(run=run, experience=g_pair[0], other=g_pair[1].pk, winner="a", author=bob)
    expect[fb.pk] = ("reward_model", "")
    assert rm_publish(run).trained_on == [fb.pk]
    # Trained: rated, then its group trained in step 1 (v1).
    g_trained = _group(run)
    fb = feedback_rate(run=run, experience=g_trained[0], score=5, author=annotator)
    expect[fb.pk] = ("trained", "")
    # Trained too: a ranking of the same group (its trained-on experiences are its value's order).
    fb = feedback_rank(run=run, order=[e.pk for e in g_trained], author=bob)
    expect[fb.pk] = ("trained", "")
    _train(run, 1, g_trained)
    # Late: rated after its group was trained. The policy will not train on it, but no
    # reward-model version has read it yet and the run's next one will: pending for it (once
    # the run ends unread: unused, late).
    fb = feedback_rate(run=run, experience=g_trained[1], score=2, author=bob)
    assert fb.late
    expect[fb.pk] = ("pending", "reward_model_next")
    # A correction in GRPO: saved as an expert experience that this run never trains (the
    # reward model's next version reads it, as above).
    fb, _expert = feedback_edit(run=run, author=annotator, experience=_group(run)[0], text="<answer>4</answer>")
    expect[fb.pk] = ("pending", "reward_model_next")
    # Rejected on review.
    fb = feedback_rate(run=run, experience=_group(run)[0], score=1, author=bob)
    feedback_reject(run=run, feedback_id=fb.pk, reviewer=owner)
    expect[fb.pk] = ("unused", "rejected")
    # Its group dropped by the owner (a filter).
    g_dropped = _group(run)
    fb = feedback_rate(run=run, experience=g_dropped[0], score=4, author=annotator)
    experiences_bulk(run=run, user=owner, action="exclude", ids=[e.pk for e in g_dropped])
    expect[fb.pk] = ("pending", "reward_model_next")
    # Pending: its group waits for labels; another's is in the queue for training.
    fb = feedback_rate(run=run, experience=_group(run)[0], score=3, author=annotator)
    expect[fb.pk] = ("pending", "waiting")
    g_queued = _group(run)
    fb = feedback_rate(run=run, experience=g_queued[0], score=3, author=bob)
    Experience.objects.filter(pk__in=[e.pk for e in g_queued]).update(status="ready")
    expect[fb.pk] = ("pending", "queued")
    return {"run": run, "expect": expect, "bob": bob}


def rm_records(run: Run) -> tuple[dict[int, int], dict[int, str], set[int]]:
    """From the reward-model versions' recorded pair rows: label id -> the first version that
    trained on it, label id -> why the newest version that read it made no pair of it, and the
    labels any version read."""
    taught: dict[int, int] = {}
    why: dict[int, str] = {}
    read: set[int] = set()
    for rm in RewardModel.objects.filter(run=run).order_by("version"):
        read.update(rm.trained_on, rm.held_out, *rm.unpaired.values())
        for pk in rm.trained_on:
            taught.setdefault(pk, rm.version)
        for pk in rm.held_out:
            why[pk] = "heldout"
        for reason, ids in rm.unpaired.items():
            for pk in ids:
                why[pk] = reason
    return taught, why, read


def rows_ledger(run: Run) -> dict[int, tuple[str, str]]:
    """Each label's state, derived here from the rows alone (what the ledger promises): the
    policy's from the experiences, the reward model's from its versions' recorded pairs."""
    states: dict[int, tuple[str, str]] = {}
    taught, why, read = rm_records(run)
    ended = run.status in ("finished", "failed", "stopped")
    rm_next = not ended and bool(run.config.get("reward_model", {}).get("enabled"))
    for fb in Feedback.objects.filter(run=run, kind__in=["rating", "ranking", "pairwise", "edit"]):
        targets = ([fb.value["expert_id"]] if fb.kind == "edit" else fb.value["order"] if fb.kind == "ranking"
                   else [i for i in (fb.experience_id, fb.other_id) if i])
        exps = list(Experience.objects.filter(pk__in=targets))
        trains_kind = fb.kind in ("rating", "ranking")  # GRPO in blend mode folds ratings and rankings only
        if fb.review == "rejected":
            states[fb.pk] = ("unused", "rejected")
        elif trains_kind and not fb.late and any(e.trained_step is not None for e in exps):
            states[fb.pk] = ("trained", "")
        elif fb.pk in taught:
            states[fb.pk] = ("reward_model", "")
        else:
            closed = ("algorithm" if not trains_kind else "late" if fb.late or any(
                e.trained_step is not None for e in exps) else "filtered" if not exps or any(
                e.status == "filtered" for e in exps) else "run_ended" if ended else "")
            if closed and rm_next and fb.pk not in read:
                states[fb.pk] = ("pending", "reward_model_next")
            elif closed:
                states[fb.pk] = ("unused", why.get(fb.pk, closed))
            else:
                status = {e.status for e in exps}
                states[fb.pk] = ("pending", "training" if "leased" in status else "waiting" if "pending" in status
                                 else "queued")
    return states


def counts(states: dict[int, tuple[str, str]], ids: set[int] | None = None) -> Counter[str]:
    return Counter(s for pk, (s, _) in states.items() if ids is None or pk in ids)


def _api(run: Run, owner: User) -> Client:
    _, raw = api_key_create(name="reader", runs=[run], actions=["read"], created_by=owner)
    client = Client()
    client.defaults["HTTP_AUTHORIZATION"] = f"Bearer {raw}"
    return client


def _page_counts(html: str, element_id: str) -> dict[str, int]:
    block = re.search(rf'id="{element_id}".*?</div>', html, re.S)
    assert block, f"no #{element_id} on the page"
    return {k: int(v) for k, v in re.findall(r'data-ledger="(\w+)">(\d+)<', block.group(0))}


def test_every_label_is_in_exactly_one_state(labelled: dict[str, Any], owner: User) -> None:
    from apps.feedback.ledger import label_states, run_ledger

    run, expect = labelled["run"], labelled["expect"]
    derived = rows_ledger(run)
    got = {pk: (s.state, s.reason) for pk, s in label_states(run=run).items()}
    assert got == expect == derived
    # Trained: step 1, in v1.
    trained = next(s for s in label_states(run=run).values() if s.state == "trained")
    assert (trained.step, trained.version, trained.text) == (1, 1, "trained in step 1, in v1")
    # Per run and per person: each label counted once, the people adding up to the run.
    ledger = run_ledger(run=run)
    assert ledger.run.total == len(expect) == sum(c.total for c in ledger.people.values())
    assert dict(counts(derived)) == {k: v for k, v in ledger.run.as_dict().items()
                                     if k in ("trained", "reward_model", "pending", "unused") and v}
    # The counts (in the database) are the labels' states (read label by label), per person too.
    states = label_states(run=run)
    for who, got_counts in ledger.people.items():
        theirs = Feedback.objects.filter(run=run, author__username=who).values_list("pk", flat=True)
        assert Counter(states[pk].state for pk in theirs) == Counter(
            {k: v for k, v in got_counts.as_dict().items() if k in ("trained", "reward_model", "pending", "unused")
             and isinstance(v, int) and v}), who
    reasons = Counter(s.reason for s in states.values() if s.state == "unused")
    assert ledger.run.as_dict()["unused_by"] == {r: reasons[r] for r in UNUSED}


def test_the_pages_api_and_cli_show_the_rows_counts(labelled: dict[str, Any], owner: User, annotator: User) -> None:
    run, bob = labelled["run"], labelled["bob"]
    derived = rows_ledger(run)
    by_author = {u.get_username(): set(Feedback.objects.filter(run=run, author=u).values_list("pk", flat=True))
                 for u in (annotator, bob)}
    # The annotation page: the person's own labels and the run's.
    client = Client()
    client.force_login(annotator)
    html = client.get(f"/runs/{run.pk}/annotate/").content.decode()
    mine = counts(derived, by_author["annotator"])
    assert _page_counts(html, "ledger-mine") == {"total": sum(mine.values()), "trained": mine["trained"],
                                                 "reward_model": mine["reward_model"], "pending": mine["pending"],
                                                 "unused": mine["unused"]}
    everyone = counts(derived)
    assert _page_counts(html, "ledger-run") == {"total": len(derived), **{k: everyone[k] for k in
                                                 ("trained", "reward_model", "pending", "unused")}}
    # The run page: the run's and each person's row, with why unused.
    owner_client = Client()
    owner_client.force_login(owner)
    page = owner_client.get(f"/runs/{run.pk}/").content.decode()
    assert _page_counts(page, "ledger-run") == {"total": len(derived), **{k: everyone[k] for k in
                                                ("trained", "reward_model", "pending", "unused")}}
    section = re.search(r'<section class="card run-ledger" id="run-ledger">.*?</section>', page, re.S)
    assert section
    row = re.search(r'<tr data-person="bob">(.*?)</tr>', section.group(0), re.S)
    assert row
    bobs = counts(derived, by_author["bob"])
    assert re.findall(r'data-ledger="(\w+)">(\d+)<', row.group(1)) == [
        ("total", str(sum(bobs.values()))), ("trained", str(bobs["trained"])),
        ("reward_model", str(bobs["reward_model"])), ("pending", str(bobs["pending"])), ("unused", str(bobs["unused"]))]
    reasons_of_bob = re.search(r'<p class="muted" data-person-unused="bob">(.*?)</p>', section.group(0), re.S)
    assert reasons_of_bob
    assert 'data-unused="rejected">1 rejected in review' in reasons_of_bob.group(1)
    # Bob's late label waits for the reward model's next version: not unused yet.
    assert 'data-unused="late"' not in reasons_of_bob.group(1)
    # The API: the run's ledger and each label's state.
    api = _api(run, owner)
    body = api.get(f"/api/v1/runs/{run.pk}/labels").json()
    assert {k: body["run"][k] for k in ("trained", "reward_model", "pending", "unused")} == {
        k: everyone[k] for k in ("trained", "reward_model", "pending", "unused")}
    reasons = Counter(r for s, r in derived.values() if s == "unused")
    assert body["run"]["unused_by"] == {r: reasons[r] for r in UNUSED}
    waiting = Counter(r for s, r in derived.values() if s == "pending")
    assert body["run"]["pending_by"] == {r: waiting[r] for r in ("waiting", "queued", "training", "reward_model_next")}
    assert waiting["reward_model_next"] == 3
    assert body["people"]["bob"]["total"] == len(by_author["bob"])
    for pk, (state, reason) in derived.items():
        got = api.get(f"/api/v1/runs/{run.pk}/feedback/{pk}").json()["state"]
        assert (got["state"], got["reason"]) == (state, reason), pk
    assert api.get(f"/api/v1/runs/{run.pk}/feedback/999999999").status_code == 404
    # The CLI.
    out = StringIO()
    call_command("rft", "figures", str(run.pk), stdout=out)
    assert (f"all labels: {len(derived)} labels: {everyone['trained']} trained, {everyone['reward_model']} taught the "
            f"reward model only, {everyone['pending']} pending, {everyone['unused']} unused") in out.getvalue()


def test_when_the_run_ends_held_groups_are_released_and_their_labels_unused(
        labelled: dict[str, Any], owner: User, annotator: User) -> None:
    run = labelled["run"]
    pending = [pk for pk, (s, r) in labelled["expect"].items() if s == "pending" and r != "reward_model_next"]
    unread = [pk for pk, (s, r) in labelled["expect"].items() if r == "reward_model_next"]
    Experience.objects.filter(run=run, status__in=["pending", "ready"]).update(held_until="2099-01-01T00:00:00Z")
    run_transition(run=run, action="stop", actor=owner)
    assert not Experience.objects.filter(run=run, held_until__isnull=False).exists()
    # An annotation page still open renews nothing on an ended run.
    from apps.feedback.handout.holds import holds_renew

    assert holds_renew(run=Run.objects.get(pk=run.pk), annotator=annotator) == 0
    assert not Experience.objects.filter(run=run, held_until__isnull=False).exists()
    derived = rows_ledger(run)
    assert all(derived[pk] == ("unused", "run_ended") for pk in pending)
    # No reward-model version will read the labels it had not read: their policy's reasons.
    assert sorted(derived[pk][1] for pk in unread) == ["algorithm", "filtered", "late"]
    from apps.feedback.ledger import label_states

    assert {pk: (s.state, s.reason) for pk, s in label_states(run=run).items()} == derived
    # The summary says so, per run and per person, as the rows do.
    client = Client()
    client.force_login(owner)
    html = client.get(f"/runs/{run.pk}/").content.decode()
    everyone = counts(derived)
    assert _page_counts(html, "ledger-summary")["unused"] == everyone["unused"]
    assert f'data-unused="run_ended"><span data-n>{len(pending)}</span> unused: the run ended before its group trained' in html
    api = _api(run, owner)
    assert api.get(f"/api/v1/runs/{run.pk}/labels").json()["run"]["unused_by"]["run_ended"] == len(pending)
    # The end-of-run notification says the same.
    from apps.control.notifications import end_message

    body = end_message(run=run, state="stopped", reason="").body
    assert (f"Where the labels went: {everyone['trained']} trained, {everyone['reward_model']} taught the reward "
            f"model only, 0 pending, {everyone['unused']} unused") in body


def test_a_correction_says_where_it_counts(owner: User, annotator: User) -> None:
    """GRPO does not train on expert experiences: the saved panel says so, never "saved as
    expert experience" alone; SFT does, and says so."""
    for algorithm, words in (("grpo", "not trained by this run: grpo does not train on corrections: they count in "
                                      "an SFT or MIX run, or an export (sft.jsonl)"),
                             ("sft", "this run&#x27;s sft batches train on it")):
        extra: dict[str, Any] = {"repeat_times": 1} if algorithm == "sft" else {}
        run = make_run(owner=owner, taskset=make_taskset(owner=owner), algorithm=algorithm, feedback={"mode": "blend"},
                       **extra)
        add_member(run, annotator)
        run_transition(run=run, action="start", actor=owner)
        e = _group(run)[0]
        client = Client()
        client.force_login(annotator)
        html = client.post(f"/runs/{run.pk}/annotate/experiences/{e.pk}/edit/", {"text": "<answer>4</answer>"},
                           HTTP_HX_REQUEST="true").content.decode()
        assert "Saved as expert experience #" in html and words in html, html


def _prompt(run: Run, *, heldout: bool, share: float) -> str:
    """A prompt the reward model's split holds out (or trains on), found by trying names."""
    return next(p for p in (f"prompt {i}" for i in range(200))
                if prompt_is_heldout(p, share=share, seed=run.cfg.seed) == heldout)


def _members(run: Run, group: str, prompt: str, n: int) -> list[Experience]:
    from apps.buffer.services import experience_write
    from tests.factories import experience_row

    rows = [experience_row(run, key=f"{group}-{i}", group=group, status="pending", reward=None, auto_reward=0.5,
                           prompt_text=prompt, response_text=f"{group} answer {i}") for i in range(n)]
    return list(Experience.objects.filter(pk__in=experience_write(experiences=rows).ids).order_by("id"))


@pytest.fixture
def unpaired(owner: User) -> dict[str, Any]:
    """A GRPO run (blend, raters weighted by gold items) with a label of each kind that makes
    no preference pair, one that does, and a reward-model version trained after all of them."""
    import random

    from apps.feedback.raters.reliability import TRUSTED_WEIGHT
    from apps.feedback.raters.reliability import rater_weights

    share = 0.5
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), name="unpaired", total_steps=5,
                   feedback={"mode": "blend", "rater_weighting": "gold"},
                   reward_model={"enabled": True, "heldout_share": share})
    careful, careless = make_user("careful"), make_user("careless")
    for u in (careful, careless):
        add_member(run, u)
    run_transition(run=run, action="start", actor=owner)
    rng = random.Random(3)
    ids: dict[str, list[int]] = {"gold": [], "taught": [], "heldout": [], "lone": [], "untrusted": []}
    # Gold items, which measure the raters: careful answers right, careless at random.
    for i, e in enumerate(_members(run, "gold", _prompt(run, heldout=False, share=share), 8)):
        GoldItem.objects.create(run=run, experience=e, answer=1.0 if i % 2 == 0 else 0.0)
        ids["gold"].append(feedback_rate(run=run, author=careful, experience=e, score=5 if i % 2 == 0 else 1).pk)
        ids["gold"].append(feedback_rate(run=run, author=careless, experience=e, score=rng.randint(1, 5)).pk)
    weights = rater_weights(run=run, earned=True)
    assert weights is not None and weights[careless.pk] < TRUSTED_WEIGHT <= weights[careful.pk]
    # A pair trained on: careful rates two members of a trained prompt; careless rates the third.
    a, b, c = _members(run, "taught", _prompt(run, heldout=False, share=share), 3)
    ids["taught"] += [feedback_rate(run=run, author=careful, experience=a, score=5).pk,
                      feedback_rate(run=run, author=careful, experience=b, score=1).pk]
    ids["untrusted"].append(feedback_rate(run=run, author=careless, experience=c, score=3).pk)
    # An untrusted A/B choice too (GRPO would not train on it either: the reward model's reason shows).
    ids["untrusted"].append(feedback_compare(run=run, author=careless, experience=a, other=b.pk, winner="b").pk)
    # A pair whose prompt is held out for the version's evaluation.
    a, b = _members(run, "heldout", _prompt(run, heldout=True, share=share), 2)
    ids["heldout"] += [feedback_rate(run=run, author=careful, experience=a, score=5).pk,
                       feedback_rate(run=run, author=careful, experience=b, score=2).pk]
    # A lone rating: no other member of its group rated.
    (a, _b) = _members(run, "lone", _prompt(run, heldout=False, share=share), 2)
    ids["lone"].append(feedback_rate(run=run, author=careful, experience=a, score=4).pk)
    rm = rm_publish(run)  # trained after every label above
    assert rm.version == 1
    return {"run": run, "ids": ids, "rm": rm}


def test_a_label_that_made_no_pair_is_not_taught_and_says_why(unpaired: dict[str, Any], owner: User) -> None:
    from apps.feedback.ledger import REASON_WORDS, label_states, run_ledger

    run, ids, rm = unpaired["run"], unpaired["ids"], unpaired["rm"]
    # The version read every label after it was saved: the old timestamp rule called them all taught.
    assert all(fb.created_at <= rm.created_at for fb in Feedback.objects.filter(run=run))
    assert rm.trained_on == sorted(ids["taught"]) and rm.held_out == sorted(ids["heldout"])
    # While their groups are open, the policy may still train on them: pending, not taught.
    states = label_states(run=run)
    assert {pk: (s.state, s.reason) for pk, s in states.items()} == rows_ledger(run)
    for reason in ("gold", "heldout", "lone", "untrusted"):
        for pk in ids[reason]:
            kind = Feedback.objects.get(pk=pk).kind
            assert states[pk].state == ("unused" if kind == "pairwise" else "pending"), (reason, pk, states[pk])
    assert {states[pk].state for pk in ids["taught"]} == {"reward_model"}
    assert {states[pk].text for pk in ids["taught"]} == {"taught the reward model v1"}
    # Once the run ended, each is unused with its own reason, everywhere the ledger shows.
    run_transition(run=run, action="stop", actor=owner)
    run = Run.objects.get(pk=run.pk)
    derived = rows_ledger(run)
    states = label_states(run=run)
    assert {pk: (s.state, s.reason) for pk, s in states.items()} == derived
    for reason in ("gold", "heldout", "lone", "untrusted"):
        for pk in ids[reason]:
            assert (states[pk].state, states[pk].reason) == ("unused", reason), (reason, pk)
            assert states[pk].text == f"unused: {REASON_WORDS[reason]}"
    ledger = run_ledger(run=run)
    assert ledger.run.reward_model == len(ids["taught"]) == counts(derived)["reward_model"]
    assert {r: n for r, n in ledger.run.unused_by.items() if r in ("gold", "heldout", "lone", "untrusted")} == {
        r: len(ids[r]) for r in ("gold", "heldout", "lone", "untrusted")}
    # The API's label endpoint and the run's summary page say the same.
    api = _api(run, owner)
    for pk, (state, reason) in derived.items():
        got = api.get(f"/api/v1/runs/{run.pk}/feedback/{pk}").json()["state"]
        assert (got["state"], got["reason"]) == (state, reason), pk
    assert api.get(f"/api/v1/runs/{run.pk}/labels").json()["run"]["unused_by"]["lone"] == 1
    client = Client()
    client.force_login(owner)
    html = client.get(f"/runs/{run.pk}/").content.decode()
    assert _page_counts(html, "ledger-summary")["reward_model"] == len(ids["taught"])
    assert f'data-unused="lone"><span data-n>1</span> unused: {REASON_WORDS["lone"]}' in html


def test_a_label_its_group_trained_is_trained_whatever_pair_it_made(unpaired: dict[str, Any]) -> None:
    """The lone rating's group trained by the policy: trained, not unused (the policy's use
    goes first)."""
    run, ids = unpaired["run"], unpaired["ids"]
    (lone,) = ids["lone"]
    group = list(Experience.objects.filter(run=run, group_id="lone").order_by("id"))
    # Only the lone rating's group in the batch (the groups people rated fully are ready too).
    Experience.objects.filter(run=run, status="ready").update(status="pending")
    _train(run, 1, group)
    from apps.feedback.ledger import label_state

    state = label_state(feedback=Feedback.objects.get(pk=lone))
    assert state is not None and (state.state, state.step) == ("trained", 1)
    assert rows_ledger(run)[lone] == ("trained", "")


def test_a_label_taught_the_first_version_that_trained_on_it(labelled: dict[str, Any]) -> None:
    """Version 2 no longer trusts the A/B choice's rater and pairs the late rating: the choice
    still taught v1 (a fact about v1), the late rating taught v2; rows and ledger agree."""
    from apps.feedback.ledger import label_states, run_ledger
    from apps.feedback.reward_model.preferences import PairLabels

    run, expect = labelled["run"], labelled["expect"]
    (choice,) = [pk for pk, (s, _) in expect.items() if s == "reward_model"]
    late = Feedback.objects.get(run=run, kind="rating", late=True).pk
    rm = reward_model_publish(run=run, path="/x/rm2", base="b", accuracy=None, pairs_train=1, pairs_heldout=0,
                              labels=0, seconds=0.0,
                              pair_labels=PairLabels(trained_on=[late], held_out=[], unpaired={"untrusted": [choice]}))
    assert rm.version == 2
    states = label_states(run=run)
    assert (states[choice].state, states[choice].version, states[choice].text) == (
        "reward_model", 1, "taught the reward model v1")
    assert (states[late].state, states[late].version) == ("reward_model", 2)
    assert {pk: (s.state, s.reason) for pk, s in states.items()} == rows_ledger(run)
    assert run_ledger(run=run).run.reward_model == 2 == counts(rows_ledger(run))["reward_model"]


def test_a_label_the_policy_will_not_train_waits_for_the_reward_models_next_version(
        labelled: dict[str, Any]) -> None:
    """A late label in a running run with a reward model is pending for the next version, not
    unused; once a version has read it, it is what that version recorded of it (taught, or
    unused with the version's reason or, with none, its policy's), as the rows say."""
    from apps.feedback.ledger import label_states

    run = labelled["run"]
    late = Feedback.objects.get(run=run, kind="rating", late=True)
    assert (label_states(run=run)[late.pk].state, label_states(run=run)[late.pk].reason) == (
        "pending", "reward_model_next")
    rm = rm_publish(run)
    assert late.pk in {*rm.trained_on, *rm.held_out, *(pk for ids in rm.unpaired.values() for pk in ids)}
    derived = rows_ledger(run)
    states = {pk: (s.state, s.reason) for pk, s in label_states(run=run).items()}
    assert states == derived
    assert "reward_model_next" not in {reason for _, reason in states.values()}
    assert states[late.pk][0] in ("reward_model", "unused")
