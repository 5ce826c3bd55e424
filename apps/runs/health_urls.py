from django.urls import path

from apps.runs import views

urlpatterns = [path("", views.health, name="health")]
