"""The unlearning methods the service offers, as the HTTP layer needs to know them.

The maths lives in workers/methods/<name>.py; this table only names each method and its
guarantee so requests can be validated without importing torch.
"""

KNOWN_METHODS: dict[str, dict[str, str]] = {
    "retrain": {"guarantee": "exact", "module": "workers.methods.retrain"},
}
