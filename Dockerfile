# One image for web and workers; GPU hosts get CUDA builds of torch and vLLM through the extras.
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml ./
COPY scripts/deps.py scripts/deps.py
RUN python scripts/deps.py train vllm tracking > /tmp/requirements.txt && pip install -r /tmp/requirements.txt
COPY . .
RUN python manage.py collectstatic --noinput
EXPOSE 8000
