# syntax=docker/dockerfile:1
# One image for both commands: `schedlock sidecar` (next to every app container) and
# `schedlock operator` (the chart's Deployment).  Build: docker build -t schedlock .
#
# Stage 1 builds the wheel and installs it with its dependencies, as resolved from the
# project's own metadata (pyproject.toml), into a venv without pip.  Stage 2 is the same slim
# Python with only that venv added: no compiler, no pip, no sources, non-root.
# tests/integration/test_chart.py runs this file's build commands outside a container.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv --without-pip /opt/schedlock \
 && pip --python /opt/schedlock/bin/python install /wheels/schedlock-*.whl \
 && /opt/schedlock/bin/schedlock --version \
 && /opt/schedlock/bin/schedlock sidecar --help > /dev/null \
 && /opt/schedlock/bin/schedlock operator --help > /dev/null

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="schedlock" \
      org.opencontainers.image.description="Scheduled work that fires once, on time, with millisecond failover, on PostgreSQL advisory locks" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/schedlock/schedlock" \
      org.opencontainers.image.documentation="https://github.com/schedlock/schedlock/tree/main/docs" \
      org.opencontainers.image.vendor="schedlock authors"
# The base image's own pip and setuptools are build tools: the runtime needs neither.
RUN python -m pip uninstall --yes --quiet pip setuptools wheel
COPY --from=build /opt/schedlock /opt/schedlock
ENV PATH=/opt/schedlock/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 65532:65532
ENTRYPOINT ["schedlock"]
CMD ["--help"]
