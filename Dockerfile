# syntax=docker/dockerfile:1
# Two images from one file:
#   api    — FastAPI + SQLAlchemy, no torch: small and quick to start.
#   worker — the same package with PyTorch (PyPI's Linux build carries CUDA); needs a GPU
#            passed through by the NVIDIA container toolkit.
FROM python:3.12-slim AS source
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /srv/vramlab
COPY pyproject.toml README.md ./
COPY app ./app
COPY workers ./workers
COPY migrations ./migrations
RUN useradd --create-home --uid 10001 vramlab

FROM source AS api
RUN pip install .
USER vramlab
EXPOSE 8000
HEALTHCHECK --interval=5s --timeout=3s --retries=20 \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/readyz')"
CMD ["vramlab", "serve", "--host", "0.0.0.0", "--port", "8000", "--no-migrate"]

FROM source AS worker
RUN pip install ".[worker,models]"
USER vramlab
CMD ["vramlab", "worker", "--device", "auto"]
