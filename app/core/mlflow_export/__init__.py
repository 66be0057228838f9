"""Every published version copied to an MLflow model registry, and a purged one's artifact
deleted there too: `registry` speaks to MLflow, `sync` decides what to copy
or delete and records it."""
