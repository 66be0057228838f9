"""Lethe's core: the database, storage, ledger and services that the HTTP edge (app.api) and
the workers share. It imports no edge; docs/architecture.md draws the layers."""
