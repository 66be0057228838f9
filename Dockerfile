# Lethe API and worker image (distributed mode; embedded when no LETHE_REDIS_URL is set). CPU
# torch by default; for GPU workers build FROM an image with CUDA and install the matching torch.
# BASE is any Debian-family image with Python 3.11: python:3.11-slim from a registry, or, where
# no registry is reachable, a bookworm root filesystem made from Debian's packages and imported
# (scripts/build-image does that with mmdebstrap and podman). Torch comes from TORCH_INDEX, or
# from a directory of wheels mounted at /wheels during the build (podman build --volume).
ARG BASE=docker.io/library/python:3.11-slim
FROM ${BASE}
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG PIP_CERT=/etc/ssl/certs/ca-certificates.crt
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 OMP_WAIT_POLICY=PASSIVE LETHE_DATA_DIR=/var/lib/lethe \
    LETHE_JOURNAL_DIR=/var/lib/lethe-journal \
    PATH=/opt/lethe/bin:$PATH
WORKDIR /srv/lethe
RUN python3 -m venv /opt/lethe \
 && useradd --system --uid 10001 --home-dir /var/lib/lethe --create-home lethe \
 && install -d -o lethe -m 700 /var/lib/lethe-journal

# Dependencies first, in layers that change only with pyproject.toml.
RUN if ls /wheels/torch-2.13.0+cpu-*.whl >/dev/null 2>&1; then \
      pip install --find-links /wheels "torch==2.13.0+cpu"; \
    else \
      pip install torch==2.13.0 --index-url "$TORCH_INDEX"; \
    fi
COPY pyproject.toml ./
RUN python -c "import subprocess, sys, tomllib; \
deps = [d for d in tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'] \
        if not d.startswith('torch')]; \
subprocess.check_call([sys.executable, '-m', 'pip', 'install', *deps])"

# Then the code, installed as a package (not editable).
COPY README.md alembic.ini ./
COPY app ./app
COPY workers ./workers
COPY methods ./methods
COPY architectures ./architectures
COPY maths ./maths
COPY lethe ./lethe
COPY clients/python ./clients/python
COPY migrations ./migrations
COPY scripts ./scripts
RUN pip install --no-deps . && rm -rf build *.egg-info

USER lethe
EXPOSE 8000
# The API's liveness; the worker service overrides it (compose: its metrics port).
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"
CMD ["lethe", "serve", "--host", "0.0.0.0", "--port", "8000"]
