# Images of vramlab from one file (no `# syntax=` line: the engine's own frontend reads
# this file, with BuildKit or the classic builder alike), each from its distributions:
#   api        — the server's (FastAPI + SQLAlchemy + the result plots) and the client's, no
#                torch and no worker: small, quick to start.
#   worker-cpu — the worker's (worker/pyproject.toml) and the client's with PyTorch's CPU
#                build: no web stack. A laptop or CI without a GPU.
#   worker     — the same with PyTorch's CUDA build (PyPI's Linux wheel); needs a GPU passed
#                through by the NVIDIA container toolkit.
#   predictor  — worker-cpu plus the server's, for `vramlab predictor` (the API image has
#                no torch, so the API asks this service for model predictions).
# Each installs into /opt/vramlab (a virtual environment) in a build stage; the image
# itself gets that folder and a non-root user (uid 10001), no compiler, no pip cache.
# The classic builder keeps each build stage as an untagged image (its cache); they carry
# the label dev.vramlab.stage=build, so that
#   docker image prune -f --filter label=dev.vramlab.stage=build
# removes them and nothing else. BuildKit keeps no such images.
ARG PYTHON_IMAGE=python:3.12-slim

FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/vramlab/bin:$PATH MPLCONFIGDIR=/tmp/matplotlib
RUN useradd --create-home --uid 10001 --user-group vramlab
WORKDIR /home/vramlab

# The dependencies first (a layer that changes only with the pyproject files: the
# distributions built from them without their packages, then removed), then the code.
FROM base AS build-api
LABEL dev.vramlab.stage=build
WORKDIR /src
RUN python -m venv /opt/vramlab
COPY pyproject.toml README.md ./
COPY client/pyproject.toml client/README.md ./client/
RUN pip install ./client . && pip uninstall -y -q vramlab vramlab-client
COPY app ./app
COPY migrations ./migrations
COPY client ./client
RUN pip install --no-deps ./client . && pip uninstall -y -q pip setuptools
# Slimming (the api image stays under 250 MB): no tests, stubs or sample data; extension
# modules without their symbols; the libraries as bytecode only (compiled here once, beside
# where their sources were, without docstrings or asserts), vramlab's own code as sources
# and plain bytecode.
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends binutils >/dev/null \
 && cd /opt/vramlab/lib/python3*/site-packages \
 && rm -rf matplotlib/mpl-data/sample_data matplotlib/tests mpl_toolkits/*/tests \
           numpy/*/tests numpy/tests numpy/_pyinstaller numpy/f2py fontTools/*/tests \
           PIL/tests certifi/tests PIL/_avif.* pillow.libs/libavif-* numpy/_core/_simd.* \
           sqlalchemy/dialects/mssql sqlalchemy/dialects/mysql sqlalchemy/dialects/oracle \
           fontTools/feaLib fontTools/voltLib fontTools/mtiLib fontTools/ufoLib \
           fontTools/designspaceLib fontTools/qu2cu fontTools/cu2qu fontTools/svgLib \
           fontTools/merge matplotlib/mpl-data/fonts/ttf/STIX* matplotlib/mpl-data/images \
           matplotlib/mpl-data/fonts/ttf/DejaVuSerif* matplotlib/mpl-data/fonts/ttf/cm* \
           matplotlib/mpl-data/fonts/ttf/DejaVuSansMono* matplotlib/backends/web_backend \
           numpy/_core/include numpy/_core/lib \
           matplotlib/mpl-data/fonts/afm matplotlib/mpl-data/fonts/pdfcorefonts \
 && find /opt/vramlab -name '*.pyi' -delete \
 && find /opt/vramlab -name '__pycache__' -prune -exec rm -rf {} + \
 && find /opt/vramlab -name '*.cpython-*.so' -exec strip --strip-unneeded {} + \
 && python -m compileall -q -j0 -b -o 2 /opt/vramlab/lib >/dev/null \
 && find . -name '*.py' ! -path './app/*' ! -path './vramlab/*' ! -path './migrations/*' -delete \
 && find ./app ./vramlab ./migrations -name '*.pyc' -delete \
 && python -m compileall -q -j0 ./app ./vramlab ./migrations >/dev/null

FROM base AS api
COPY --from=build-api /opt/vramlab /opt/vramlab
USER vramlab
EXPOSE 8000
HEALTHCHECK --interval=5s --timeout=3s --start-period=10s --retries=20 \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/readyz')"
CMD ["vramlab", "serve", "--host", "0.0.0.0", "--port", "8000", "--no-migrate"]

# Workers: torch first, then the worker's distribution and the client's (their
# dependencies first, as above), never the server's. worker-cpu takes PyTorch's CPU build
# from PyTorch's CPU index (TORCH_CPU_PIP_ARGS); worker takes PyPI's CUDA build
# (TORCH_CUDA_PIP_ARGS). A machine with no route to an index puts the wheel in
# deploy/wheels/ and passes `--build-arg TORCH_CPU_PIP_ARGS="--find-links /wheels"` (the
# deployment test).
FROM base AS build-worker-cpu-env
LABEL dev.vramlab.stage=build
ARG TORCH_VERSION=2.13.0
ARG TORCH_CPU_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
WORKDIR /src
RUN python -m venv /opt/vramlab
COPY deploy/wheels/ /wheels/
RUN pip install $TORCH_CPU_PIP_ARGS "torch==${TORCH_VERSION}"
COPY client/pyproject.toml client/README.md ./client/
COPY worker/pyproject.toml worker/README.md ./worker/
RUN pip install ./client "./worker[models]" && pip uninstall -y -q vramlab-client vramlab-worker
COPY client ./client
COPY workers ./workers
RUN pip install --no-deps ./client ./worker

FROM build-worker-cpu-env AS build-worker-cpu
RUN pip uninstall -y -q pip

FROM base AS worker-cpu
COPY --from=build-worker-cpu /opt/vramlab /opt/vramlab
USER vramlab
# SIGTERM drains: the running experiment finishes first (compose's stop_grace_period and
# Kubernetes' terminationGracePeriodSeconds give it the time).
CMD ["vramlab", "worker", "--device", "cpu"]

# The model predictor: the worker-cpu environment (torch, transformers, the predictor's
# children in workers/) plus the server's distribution (`vramlab predictor`). Its stages
# come before the GPU worker's: a builder that builds every stage up to its target then
# never builds the CUDA environment for it (nor leaves the GPU worker's image untagged).
FROM build-worker-cpu-env AS build-predictor
COPY pyproject.toml README.md ./
RUN pip install . && pip uninstall -y -q vramlab
COPY app ./app
COPY migrations ./migrations
RUN pip install --no-deps . && pip uninstall -y -q pip

FROM base AS predictor
COPY --from=build-predictor /opt/vramlab /opt/vramlab
USER vramlab
EXPOSE 8100
CMD ["vramlab", "predictor", "--host", "0.0.0.0", "--port", "8100"]

FROM base AS build-worker
LABEL dev.vramlab.stage=build
ARG TORCH_VERSION=2.13.0
ARG TORCH_CUDA_PIP_ARGS=""
WORKDIR /src
RUN python -m venv /opt/vramlab
COPY deploy/wheels/ /wheels/
RUN pip install $TORCH_CUDA_PIP_ARGS "torch==${TORCH_VERSION}"
COPY client/pyproject.toml client/README.md ./client/
COPY worker/pyproject.toml worker/README.md ./worker/
RUN pip install ./client "./worker[models]" && pip uninstall -y -q vramlab-client vramlab-worker
COPY client ./client
COPY workers ./workers
RUN pip install --no-deps ./client ./worker && pip uninstall -y -q pip

FROM base AS worker
COPY --from=build-worker /opt/vramlab /opt/vramlab
USER vramlab
CMD ["vramlab", "worker", "--device", "auto"]
