# syntax=docker/dockerfile:1
# GPU image: Ray (the KubeRay head and workers), sglang with its CUDA kernels, and this package, whose
# entry point `sglang.srt.plugins: fairshare` puts our scheduling policy in every sglang scheduler.
# No model weights: they come from a volume (k8s/overlays/gpu). Build from the repository root:
#   docker build -t REGISTRY/fairshare-serve:0.1.0-gpu .
# The pins must equal pyproject.toml (ray) and the Makefile (sglang, torch); tests/k8s checks them.
ARG RAY_VERSION=2.60.0
ARG PYTHON_TAG=py311

# Stage 1: the wheel. Only the package sources go in; tests, configs and the venv stay out.
FROM rayproject/ray:${RAY_VERSION}-${PYTHON_TAG}-gpu AS wheel
WORKDIR /home/ray/build
COPY --chown=ray:users pyproject.toml README.md ./
COPY --chown=ray:users scheduler ./scheduler
COPY --chown=ray:users serve_app ./serve_app
RUN pip wheel --no-deps --no-cache-dir --wheel-dir /home/ray/wheels .

# Stage 2: the runtime, as the image's non-root `ray` user (uid 1000).
FROM rayproject/ray:${RAY_VERSION}-${PYTHON_TAG}-gpu
ARG RAY_VERSION
ARG SGLANG_VERSION=0.5.23
ARG TORCH_VERSION=2.14.1
USER 1000
WORKDIR /home/ray
COPY --from=wheel --chown=ray:users /home/ray/wheels /tmp/wheels
# Serve's HAProxy front with splice off, which the overlays name (serve_app/config/haproxy_binary.py).
# sglang 0.5.23 pins torch 2.14.1 and its kernels (flashinfer for CUDA 13): the node's driver must run CUDA 13.
RUN pip install --no-cache-dir "ray[serve]==${RAY_VERSION}" "sglang==${SGLANG_VERSION}" "torch==${TORCH_VERSION}" \
        /tmp/wheels/fairshare_serve-*.whl \
    && rm -rf /tmp/wheels \
    && python -c "from importlib.metadata import entry_points; assert entry_points(group='sglang.srt.plugins', name='fairshare')" \
    && python -m serve_app.config.haproxy_binary /home/ray/bin/haproxy-nosplice
