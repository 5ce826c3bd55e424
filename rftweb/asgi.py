"""HTTP and WebSocket entry point."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rftweb.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter
from channels.security.websocket import AllowedHostsOriginValidator

from rftweb.degrade import SocketDegrade
from rftweb.request_guard import RequestGuard, daphne_guard_install
from rftweb.routing import websocket_urlpatterns

daphne_guard_install()
# The guard first (rftweb/request_guard.py): the client's address from named proxies only,
# body caps checked before and while the body is read, API bodies refused to the anonymous.
# A websocket handshake that finds Postgres down is closed 1013, not a 500 (SocketDegrade).
application = RequestGuard(ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(
            SocketDegrade(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))
        ),
    }
))
