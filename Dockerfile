# One image for the platform (web, token) and the node client (node).
# Behind a mirror: --build-arg PYTHON_IMAGE=<a Python 3.11 image> --build-arg TORCH_INDEX_URL=<a package
# index (PEP 503) with torch's CPU wheel and its dependencies> (docs/deploy.md, "Docker image and compose").
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE}
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/app/platform \
    DJANGO_SETTINGS_MODULE=config.settings

WORKDIR /app

# CPU-only torch first, from PyTorch's own index: the default one would pull CUDA wheels (gigabytes).
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==2.13.0"

# A C compiler for this step only: reasoning-gym needs pycosat, which has no wheel for Python 3.11, and
# native/ is the moderation rules' text work in C (moderation.filters).
COPY requirements/ requirements/
COPY native/ native/
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && pip install -r requirements/base.txt -c requirements/lock.txt \
    && pip install ./native && rm -rf native \
    && apt-get purge -y gcc libc6-dev && apt-get autoremove -y && rm -rf /var/lib/apt/lists/*

COPY node_client/ node_client/
RUN pip install -c requirements/lock.txt ./node_client

COPY manage.py ./
COPY platform/ platform/
COPY frontend/ frontend/

# Static files are collected at build time into /app/staticfiles (STATIC_ROOT), hashed and compressed;
# without them every page answers 500 (docs/deploy.md). Settings need production values to import,
# not to connect.
RUN SAPO_ENV=production SAPO_SECRET_KEY=build-only SAPO_ALLOWED_HOSTS=build \
    DATABASE_URL=postgresql://build@localhost/build \
    python manage.py collectstatic --noinput -v0

RUN useradd --create-home --uid 1000 sapo \
    && mkdir -p /app/var/stats /app/var/archive /app/var/models /tokens /home/sapo/.cache/sapo-node \
    && chown -R sapo /app/var /tokens /home/sapo/.cache
USER sapo

EXPOSE 8000
# No HEALTHCHECK here: the node runs from this image too. The site's probes are /healthz (liveness)
# and /readyz (database and Redis); docker-compose.yml uses /readyz.
# sapo_serve replaces itself with the ASGI server SAPO_ASGI_SERVER names (daphne by default), with
# the options ops.serving gives it: a listen backlog for ten thousand nodes connecting at once, no access
# log of its own, the protocol's frame limit (docs/deploy.md, "Processes").
CMD ["python", "manage.py", "sapo_serve", "--port", "8000"]
