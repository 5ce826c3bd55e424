from django.urls import path

from apps.feedback.review import views

app_name = "review"

# Mounted at runs/<int:run_id>/review/ (rftweb/urls.py): the run owner's review of labels.
urlpatterns = [
    path("", views.review_page, name="page"),
    path("labels/<int:feedback_id>/accept/", views.label_accept, name="accept"),
    path("labels/<int:feedback_id>/reject/", views.label_reject, name="reject"),
    path("groups/<str:group_id>/resolve/", views.disagreement_resolve_view, name="resolve"),
]
