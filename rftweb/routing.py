from django.urls import path

from apps.runs.consumers import RunEventsConsumer, RunsListConsumer

websocket_urlpatterns = [
    path("ws/runs/<int:run_id>/", RunEventsConsumer.as_asgi()),
    path("ws/runs/", RunsListConsumer.as_asgi()),
]
