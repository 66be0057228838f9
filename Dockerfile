# Lethe API and worker image (distributed mode). CPU torch by default; for GPU workers build
# FROM an image with CUDA and install the matching torch build instead.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    OMP_WAIT_POLICY=PASSIVE LETHE_DATA_DIR=/var/lib/lethe
WORKDIR /srv/lethe
RUN useradd --system --uid 10001 --home-dir /var/lib/lethe --create-home lethe

# Dependencies first, in layers that change only with pyproject.toml.
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
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
COPY maths ./maths
COPY lethe ./lethe
COPY migrations ./migrations
COPY scripts ./scripts
RUN pip install --no-deps . && rm -rf build *.egg-info

USER lethe
EXPOSE 8000
# The API's liveness; the worker service overrides it (compose: its metrics port).
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"
CMD ["lethe", "serve", "--host", "0.0.0.0", "--port", "8000"]
