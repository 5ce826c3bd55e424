from django.urls import path

from apps.feedback import views

app_name = "feedback"

# Mounted at runs/<int:run_id>/annotate/ (rftweb/urls.py).
urlpatterns = [
    path("", views.annotate_page, name="page"),
    path("queue/", views.queue_partial, name="queue"),
    path("counts/", views.counts_partial, name="counts"),
    path("mine/", views.submissions, name="mine"),
    path("items/<int:assignment_id>/rate/", views.rate, name="rate"),
    path("items/<int:assignment_id>/skip/", views.skip, name="skip"),
    path("experiences/<int:experience_id>/edit/", views.edit, name="edit"),
    path("experiences/<int:experience_id>/rank/", views.rank, name="rank"),
    path("experiences/<int:experience_id>/compare/", views.compare, name="compare"),
]
