"""Webhooks: Standard Webhooks signatures over CloudEvents 1.0 JSON payloads, from a
durable outbox written in the same commit as the event (`events.emit`), sent at least once by
the API's sender thread (`sender.py`) with back-off, to receivers checked against SSRF
(`network.py`) and managed by admins (`endpoints.py`, app/api/webhooks.py)."""
