"""Lethe: certified machine unlearning as a service. The HTTP edge (`app/api`, `app/main.py`,
`app/cli.py`) over the core (`app/core`), with the privacy accountant (`app/privacy`) beneath."""
