# syntax=docker/dockerfile:1
# Stand-in for python:3.11-slim-bookworm where no image registry is reachable: Debian bookworm's own Python 3.11
# in a virtualenv on PATH, so `pip install` in the component Dockerfiles works as in the upstream image.
# BASE: the bare Debian image `make images` makes with mmdebstrap and `podman import` (images/README.md).
ARG BASE=localhost/harnessrl/debian:bookworm
FROM ${BASE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3=3.11.* python3-venv=3.11.* \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin VIRTUAL_ENV=/opt/venv \
    LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
CMD ["python3"]
