"""Every published version copied to an MLflow model registry, and a purged one's artifact
deleted there too (issue 58, goal 2): `registry` speaks to MLflow, `sync` decides what to copy
or delete and records it."""
