from django.urls import path

from apps.control import views

urlpatterns = [path("", views.health, name="health")]
