# syntax=docker/dockerfile:1
# One image for both commands: `schedlock sidecar` and `schedlock operator`.

FROM python:3.11-slim-bookworm AS build
WORKDIR /src
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY pyproject.toml README.md ./
COPY core ./core
COPY sidecar ./sidecar
COPY operator ./operator
# Dependencies resolve from the project's own metadata (pyproject.toml ranges).
RUN python -m venv /opt/schedlock \
 && /opt/schedlock/bin/pip install --no-compile . \
 && /opt/schedlock/bin/schedlock --version

FROM python:3.11-slim-bookworm
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="schedlock" \
      org.opencontainers.image.description="Scheduled work that fires once, on time, on PostgreSQL advisory locks" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/schedlock/schedlock"
COPY --from=build /opt/schedlock /opt/schedlock
ENV PATH=/opt/schedlock/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 65532:65532
ENTRYPOINT ["schedlock"]
CMD ["--help"]
