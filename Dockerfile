# syntax=docker/dockerfile:1
# Two images from one file:
#   schedlock          (the default, last stage) every command: `schedlock operator` (the chart's
#                      Deployment, with kopf and the Kubernetes client), inject, migrate, ...
#                      docker build -t schedlock .
#   schedlock-sidecar  `schedlock sidecar` next to every app container: the same wheel without
#                      the `operator` extra, so only what the sidecar imports (no kopf, no
#                      Kubernetes client).   docker build --target schedlock-sidecar -t schedlock-sidecar .
#
# The build stage makes the wheel once; the venv stages install it with its dependencies, as
# resolved from the project's own metadata (pyproject.toml), into a venv without pip.  The
# final stages are the slim Python, pruned, with one venv: no compiler, no pip, no sources,
# non-root.  tests/integration/test_chart.py runs this file's build commands outside a
# container.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
COPY operator ./operator
COPY sidecar ./sidecar
RUN pip wheel --no-deps --wheel-dir /wheels .

FROM build AS venv-sidecar
RUN python -m venv --without-pip /opt/schedlock \
 && pip --python /opt/schedlock/bin/python install /wheels/schedlock-*.whl \
 && /opt/schedlock/bin/schedlock --version \
 && /opt/schedlock/bin/schedlock sidecar --help > /dev/null

# The operator's venv is the sidecar's plus the operator extra: the operator image is the
# sidecar image with one layer more, which a node running both pulls once.
FROM venv-sidecar AS venv-operator
RUN pip --python /opt/schedlock/bin/python install "$(echo /wheels/schedlock-*.whl)[operator]" \
 && /opt/schedlock/bin/schedlock sidecar --help > /dev/null \
 && /opt/schedlock/bin/schedlock operator --help > /dev/null

# The sidecar's root filesystem: the slim Python with the sidecar's venv, less what a Python
# process that never installs anything does not use: pip and setuptools, the package managers
# and perl, glibc's iconv modules, docs, venv's bundled wheels, the system time zones (the
# tzdata package in the venv has them), distutils, venv, curses, dbm (and Berkeley DB), readline,
# the audio modules and the standard library's test modules,
# dpkg's per-package file lists (its status file stays, so scanners still read what the image
# came from), and the standard library's byte code except for the modules the sidecar imports
# (compiled again here: a start reads byte code, it does not compile).  Flattened below, so
# that what is removed is gone, not hidden by a whiteout.
FROM ${PYTHON_IMAGE} AS sidecar-root
RUN python -m pip uninstall --yes --quiet pip setuptools wheel
COPY --from=venv-sidecar /opt/schedlock /opt/schedlock
RUN rm -rf /usr/share/doc /usr/share/man /usr/share/info /usr/share/python-wheels \
      /usr/share/zoneinfo /usr/lib/*-linux-gnu/gconv /usr/lib/*-linux-gnu/perl* /usr/bin/perl* \
      /usr/lib/apt /usr/bin/apt* /usr/lib/*-linux-gnu/libapt-* /var/lib/apt /var/cache/* \
      /var/lib/dpkg/info \
      /usr/lib/python3.11/ensurepip /usr/lib/python3.11/lib2to3 /usr/lib/python3.11/idlelib \
      /usr/lib/python3.11/pydoc_data /usr/lib/python3.11/turtledemo /usr/lib/python3.11/distutils \
      /usr/lib/python3.11/lib-dynload/_test* /usr/lib/python3.11/lib-dynload/*xx* \
      /usr/lib/python3.11/venv /usr/lib/python3.11/curses /usr/lib/python3.11/dbm \
      /usr/lib/python3.11/lib-dynload/_curses* /usr/lib/python3.11/lib-dynload/_dbm* \
      /usr/lib/python3.11/lib-dynload/audioop* /usr/lib/python3.11/lib-dynload/ossaudiodev* \
      /usr/lib/python3.11/lib-dynload/nis* /usr/lib/python3.11/lib-dynload/readline* \
      /usr/lib/python3.11/lib-dynload/_lsprof* /usr/lib/*-linux-gnu/libdb-5* \
      /usr/local/lib/python3.11/ensurepip /usr/local/lib/python3.11/lib2to3 \
      /usr/local/lib/python3.11/idlelib /usr/local/lib/python3.11/pydoc_data \
      /usr/local/lib/python3.11/turtledemo /usr/local/lib/python3.11/test \
      /usr/local/lib/python3.11/distutils /usr/local/lib/python3.11/lib-dynload/_test* \
      /usr/local/lib/python3.11/lib-dynload/*xx* \
 && find /usr/lib/python3.11 /usr/local/lib/python3.11 -name __pycache__ -prune -exec rm -rf {} + \
 && PYTHONDONTWRITEBYTECODE='' /opt/schedlock/bin/python -c \
      "import schedlock.sidecar.process, schedlock.store.postgres, schedlock.store.sqlite, psycopg_pool" \
 && PYTHONDONTWRITEBYTECODE='' /opt/schedlock/bin/schedlock sidecar --help > /dev/null

FROM scratch AS schedlock-sidecar
ARG VERSION=0.1.0
ARG REVISION=unknown
# The flattening itself: a whole pruned root filesystem, one layer.
# hadolint ignore=DL3067
COPY --from=sidecar-root / /
LABEL org.opencontainers.image.title="schedlock-sidecar" \
      org.opencontainers.image.description="Scheduled work that fires once, on time, with millisecond failover, on PostgreSQL advisory locks" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/schedlock/schedlock" \
      org.opencontainers.image.documentation="https://github.com/schedlock/schedlock/tree/main/docs" \
      org.opencontainers.image.vendor="schedlock authors"
ENV PATH=/opt/schedlock/bin:/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 65532:65532
ENTRYPOINT ["schedlock"]
CMD ["--help"]

# The default target, last: every command, the operator with kopf and the Kubernetes client.
FROM schedlock-sidecar AS schedlock
LABEL org.opencontainers.image.title="schedlock"
COPY --from=venv-operator /opt/schedlock /opt/schedlock
