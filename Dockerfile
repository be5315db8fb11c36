# One image with every entry point: outbox, outbox-worker, outbox-controller, outbox-tui.
#
#   buildah bud --build-arg REVISION="$(git rev-parse HEAD)" -t outbox-dispatcher .
#
# BASE_IMAGE must be a Debian bookworm with Python 3.11 and its venv module; the official slim
# image is the default, and any bookworm with python3 and python3-venv builds unchanged.
# Pinned by digest: a tag moves, and the build would take whatever it points to that day.
# The tag stays for people; to move on, resolve it again and replace the digest:
#   skopeo inspect --format '{{.Digest}}' docker://docker.io/library/python:3.11-slim-bookworm
ARG BASE_IMAGE=python:3.11-slim-bookworm@sha256:a36c24f9cbdf4fd0f52d67f0823eeac19c2028c637cecc392d97f980d4fec56b

FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# Dependencies first, from the lock alone: a source change reuses this layer. The base has no
# compiler, so a dependency that needs one fails here instead of bringing a toolchain in; the
# few pure-Python sdists build with the locked setuptools (PIP_CONSTRAINT reaches pip's
# isolated build environments too).
COPY constraints.txt ./
RUN python3 -m venv /opt/outbox \
 && PIP_CONSTRAINT=constraints.txt /opt/outbox/bin/pip install --requirement constraints.txt
COPY pyproject.toml README.md ./
COPY outbox/ outbox/
COPY worker/ worker/
COPY controller/ controller/
COPY tui/ tui/
COPY demo/ demo/
COPY receiver/ receiver/
# No index and no build isolation: the lock must already hold every requirement of
# .[all] (and the build backend), or this step fails instead of fetching something unpinned.
RUN /opt/outbox/bin/pip install --no-index --no-build-isolation '.[all]' \
 && /opt/outbox/bin/pip check \
 && /opt/outbox/bin/python -m compileall -q /opt/outbox/lib \
 && /opt/outbox/bin/pip uninstall --yes pip setuptools wheel

FROM ${BASE_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE_URL=unknown
LABEL org.opencontainers.image.title="outbox-dispatcher" \
      org.opencontainers.image.description="Transactional-outbox dispatcher for PostgreSQL: worker, operator and terminal UI" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      org.opencontainers.image.licenses="Apache-2.0"
# A named account for the numeric user: libpq looks the user up when a DSN names none.
RUN groupadd --system --gid 65532 outbox \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin outbox
COPY --from=build /opt/outbox /opt/outbox
# Nothing is written at run time (bytecode was compiled in the build stage), so the root
# filesystem can be read-only; logs go to stdout unbuffered.
ENV PATH=/opt/outbox/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
# The worker is the default; the chart and the operator name their command explicitly.
CMD ["outbox-worker"]
