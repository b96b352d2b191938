# Headscope: web page + REST API showing Vision Transformer attention maps.
#
# Needs BuildKit (DOCKER_BUILDKIT=1 with the classic client, or `docker buildx build`);
# uses only the Dockerfile features built into the engine, so no `# syntax=` line
# (that would pull a frontend image from a registry).
#
#   docker build -t headscope .                                   # GPU-capable image
#   docker build --secret id=ca,src=/etc/ssl/certs/ca-certificates.crt -t headscope .
#                                                                 # behind a TLS-inspecting proxy
#   docker build --build-arg BASE_IMAGE=local/python-base:bookworm -t headscope .
#                                                                 # no registry: see scripts/docker-base-image.sh
#   docker build --build-arg TORCH=cpu -t headscope:cpu .         # CPU-only PyTorch: a venv of ~1.3 GB, not ~5.6 GB
#
# PyPI's default torch wheel bundles the CUDA runtime, so the same image runs on the CPU
# and, with the NVIDIA container toolkit on the host (`--gpus all`), on the GPU.
# The default model is fetched and converted at build time: the container needs no network.

# Any Debian-like image with Python 3.11+ (tomllib) and venv: the official image has
# /usr/local/bin/python3, a debootstrap-made one /usr/bin/python3; both are found on PATH.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE}

# Optional package index for the dependency step, e.g. a company mirror (no credentials
# here: build args are visible in `docker history`). Unset by default: PyPI.
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
# PyTorch build: empty (default) = PyPI's, with CUDA (runs on a CPU too); cpu = PyTorch's CPU
# wheel index for torch and torchvision only, as `make serve TORCH=cpu` does (no GPU in the image).
ARG TORCH=

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_DEFAULT_TIMEOUT=120 \
    PIP_ROOT_USER_ACTION=ignore \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8

# Virtualenv, the unprivileged user, and /data: the mount point for the named volume
# (extra model weights, Hugging Face hub cache). A new named volume copies this
# directory's owner, so the app can write its cache there.
RUN python3 -m venv /opt/venv \
 && groupadd --system --gid 10001 headscope \
 && useradd --system --uid 10001 --gid 10001 --home-dir /home/headscope --create-home \
        --shell /usr/sbin/nologin headscope \
 && mkdir -p /data/hf /data/models \
 && chown -R 10001:10001 /data

WORKDIR /opt/headscope

# 1. Dependencies only (the slow, big layer): the list comes from pyproject.toml (the runtime
#    dependencies and the build backend), so this layer is rebuilt only when pyproject.toml
#    changes, not on a code change.
#    The optional secret `ca` is a CA bundle for a TLS-inspecting proxy; it is mounted
#    for this step only and never written into a layer.
COPY pyproject.toml ./
RUN --mount=type=secret,id=ca,required=false \
    if [ -s /run/secrets/ca ]; then \
        export PIP_CERT=/run/secrets/ca SSL_CERT_FILE=/run/secrets/ca REQUESTS_CA_BUNDLE=/run/secrets/ca; \
    fi \
 && python3 -c "import tomllib; t = tomllib.load(open('pyproject.toml', 'rb')); print('\n'.join(t['project']['dependencies'] + t['build-system']['requires']))" \
        > /tmp/requirements.txt \
 && if [ -n "$TORCH" ]; then \
        pip install --no-deps --index-url "https://download.pytorch.org/whl/$TORCH" torch torchvision; \
    fi \
 && pip install -r /tmp/requirements.txt \
 && rm -f /tmp/requirements.txt

# 2. The default model, fetched and converted at build time by the source tree's own command
#    line (it needs only the dependencies above), into the models folder the server reads.
ENV HEADSCOPE_MODELS_DIR=/opt/headscope/models
COPY app/ app/
RUN --mount=type=secret,id=ca,required=false \
    if [ -s /run/secrets/ca ]; then \
        export PIP_CERT=/run/secrets/ca SSL_CERT_FILE=/run/secrets/ca REQUESTS_CA_BUNDLE=/run/secrets/ca; \
    fi \
 && python3 -m app.cli fetch \
 && rm -rf models/_downloads

# 3. The package, installed the way a user installs it: a wheel built here, with static/ and
#    templates/ inside it as package data (app/paths.py finds them there). A change to static/
#    or templates/ rebuilds only this quick layer; a change under app/ also step 2.
COPY README.* ./
COPY static/ static/
COPY templates/ templates/
# Readable by the app's user whatever the checkout's umask: what this step copied only (a chmod
# of all of /opt/headscope copied step 2's 93 MB model into this layer again).
RUN pip install --no-deps --no-build-isolation . \
 && rm -rf build ./*.egg-info \
 && chmod -R a+rX README.* static templates

ENV HEADSCOPE_HOST=0.0.0.0 \
    HEADSCOPE_PORT=8000 \
    HEADSCOPE_DEVICE=auto \
    HF_HOME=/data/hf

USER 10001:10001
EXPOSE 8000

# /healthz answers 200 while the process is alive (/readyz waits for the model).
# Python's urllib, so the image needs no curl; the port follows HEADSCOPE_PORT.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('HEADSCOPE_PORT', '8000'), timeout=4)"]

# No --host/--port here: flags would override HEADSCOPE_HOST/HEADSCOPE_PORT (`docker run -e
# HEADSCOPE_PORT=9000` served on 8000 while the health check probed 9000).
CMD ["headscope", "serve"]
