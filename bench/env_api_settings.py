from rftweb.settings import *

ROOT_URLCONF = "bench.env_api_urls"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
SECRET_KEY = "bench-only-not-a-secret"
