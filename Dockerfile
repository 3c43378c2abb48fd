# syntax=docker/dockerfile:1
#
# gpudra: the node daemon (`gpudra node`) and the CLI (`gpudra inventory`, `explain`, …).
#
#   docker build -t ghcr.io/gpudra/gpudra:0.1.0 --build-arg VERSION=0.1.0 \
#     --build-arg REVISION=$(git rev-parse HEAD) .
#
# Two stages: the first builds gpudra's wheel from the sources, the second installs that wheel
# and its dependencies (binary wheels from PyPI: grpcio, protobuf, pydantic-core, …) into a
# virtual environment. No compiler and no source tree reach the final image.
#
# The NVIDIA driver is NOT in the image: NVML (libnvidia-ml.so.1) and the device nodes come
# from the host, through the driver root the Helm chart mounts at /driver-root.
#
# Pin the base image by digest in release builds (python:3.11-slim-bookworm@sha256:…).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: gpudra's wheel -----------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /src
# Only what the wheel is made of (.dockerignore keeps the rest out of the context too).
COPY pyproject.toml README.md ./
COPY api/ api/
COPY driver/ driver/
COPY kube/ kube/
COPY controller/ controller/
COPY kubeletplugin/ kubeletplugin/
COPY scheduling/ scheduling/
COPY testing/ testing/
COPY cli/ cli/
# Package data: the DeviceClasses and examples the demo and `explain` read.
COPY deploy/deviceclasses/ deploy/deviceclasses/
COPY examples/ examples/
# --no-deps: only gpudra's own wheel here; its dependencies are installed in the final stage.
RUN python -m pip wheel --no-deps --wheel-dir /wheels .

# --- final: a virtual environment holding gpudra and its dependencies ----------------------
FROM ${PYTHON_IMAGE}

# Re-declared: an ARG from before the first FROM is visible only in FROM lines.
ARG PYTHON_IMAGE
ARG VERSION=0.1.0
ARG REVISION=unknown

LABEL org.opencontainers.image.title="gpudra" \
      org.opencontainers.image.description="Kubernetes DRA driver for NVIDIA GPUs, with dynamic MIG and a simulated GPU node" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"

# PYTHONUNBUFFERED: log lines reach `kubectl logs` as they are written.
# PYTHONDONTWRITEBYTECODE: the chart may mount the root filesystem read-only; pip compiled
# the bytecode at install time already.
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    VIRTUAL_ENV=/opt/gpudra \
    PATH=/opt/gpudra/bin:${PATH}

# tini runs as PID 1 (see ENTRYPOINT): it forwards signals to gpudra and reaps processes
# re-parented to PID 1 that nobody waits for, e.g. an MPS server whose control daemon exited
# first. gpudra waits for the MPS control daemons it stops itself, but only for those pids: a
# reaper waiting for any child would steal the exit status subprocess.run needs.
RUN apt-get update \
    && apt-get install --yes --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/*

# The wheel is bind-mounted from the build stage, so it never becomes a layer of this image.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m venv "${VIRTUAL_ENV}" \
    && "${VIRTUAL_ENV}/bin/pip" install /wheels/*.whl \
    && "${VIRTUAL_ENV}/bin/pip" uninstall --yes pip \
    && gpudra --help > /dev/null

# nvidia-cdi-hook: the program CDI specs name for their hooks (.so links, ldcache update, CUDA
# forward compatibility, device node protection, /dev/dri mode), with NVIDIA's command line.
# One standard-library Python file, so the chart's init container can copy it to the host
# (as NVIDIA's chart copies its own), where the container runtime runs it.
RUN install -m 0755 "$(python -c 'import gpudra.driver.cdi_hook_cli as m; print(m.__file__)')" \
        /usr/local/bin/nvidia-cdi-hook \
    && nvidia-cdi-hook noop

# Non-root by default, so the CLI (`docker run … inventory --simulate dgx-a100`) runs
# unprivileged. The node daemon is the exception: it must run as root, because the kubelet's
# socket directories (/var/lib/kubelet/plugins*, root-owned 0750) and NVML's device nodes
# belong to root. The Helm chart asks for that explicitly (runAsUser: 0, with the reason next
# to it) instead of the image granting root to every use of it.
RUN groupadd --system --gid 65532 gpudra \
    && useradd --system --uid 65532 --gid gpudra --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin gpudra
USER 65532:65532

# Without this image's entrypoint (a pod `command:` override, `docker run --entrypoint`), give
# gpudra an init another way: `docker run --init`, or `shareProcessNamespace: true` in a pod.
ENTRYPOINT ["/usr/bin/tini", "--", "gpudra"]
CMD ["node"]
