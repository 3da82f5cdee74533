# One image for the platform (web, token) and the node client (node).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/app/platform \
    DJANGO_SETTINGS_MODULE=config.settings

WORKDIR /app

# CPU-only torch first, from PyTorch's own index: the default one would pull CUDA wheels (gigabytes).
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0"

COPY requirements/ requirements/
RUN pip install -r requirements/base.txt -c requirements/lock.txt

COPY node_client/ node_client/
RUN pip install -c requirements/lock.txt ./node_client

COPY manage.py ./
COPY platform/ platform/
COPY frontend/ frontend/

# Static files are collected at build time; settings need production values to import, not to connect.
RUN SAPO_ENV=production SAPO_SECRET_KEY=build-only DATABASE_URL=postgresql://build@localhost/build \
    python manage.py collectstatic --noinput -v0

RUN useradd --create-home --uid 1000 sapo && mkdir -p /app/var /tokens && chown -R sapo /app/var /tokens
USER sapo

EXPOSE 8000
CMD ["daphne", "-b", "0.0.0.0", "-p", "8000", "config.asgi:application"]
