from django.urls import path

from apps.feedback import views

app_name = "feedback"

# Mounted at runs/<int:run_id>/annotate/ (rftweb/urls.py).
urlpatterns = [
    path("", views.annotate_page, name="page"),
    path("queue/", views.queue_partial, name="queue"),
    path("counts/", views.counts_partial, name="counts"),
    path("labels/", views.ledger_partial, name="ledger"),
    path("mine/", views.submissions, name="mine"),
    path("mine/<int:feedback_id>/revise/", views.revise, name="revise"),
    path("items/<int:assignment_id>/rate/", views.rate, name="rate"),
    path("items/<int:assignment_id>/skip/", views.skip, name="skip"),
    # A kind's panel (apps.feedback.kinds: its panel_template) at its slug; the built-in ones
    # by the names they had before the kinds owned their panels.
    path("experiences/<int:experience_id>/edit/", views.panel, {"slug": "edit"}, name="edit"),
    path("experiences/<int:experience_id>/rank/", views.panel, {"slug": "rank"}, name="rank"),
    path("experiences/<int:experience_id>/compare/", views.panel, {"slug": "compare"}, name="compare"),
    path("experiences/<int:experience_id>/<slug:slug>/", views.panel, name="panel"),
]
