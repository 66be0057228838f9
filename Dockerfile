# Lethe API and worker image (distributed mode). CPU torch by default; for GPU workers build
# FROM an image with CUDA and install the matching torch build instead.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    OMP_WAIT_POLICY=PASSIVE
WORKDIR /srv/lethe
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md alembic.ini ./
COPY app ./app
COPY workers ./workers
COPY migrations ./migrations
COPY scripts ./scripts
RUN pip install -e .
EXPOSE 8000
CMD ["lethe", "serve", "--host", "0.0.0.0", "--port", "8000"]
