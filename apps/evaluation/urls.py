from django.urls import path

from apps.evaluation import views

app_name = "evaluation"

urlpatterns = [
    path("<str:token>/", views.vote_page, name="vote"),
    path("<str:token>/<str:item>/", views.vote_submit, name="vote_submit"),
]
