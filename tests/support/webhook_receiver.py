"""A webhook receiver for the tests, run as its own process: it verifies each POST's
Standard Webhooks signature with the `standardwebhooks` package against the secrets given in
LETHE_TEST_WEBHOOK_SECRETS (space-separated; any one may match), answers 204 to a valid one
and 401 to anything else, and appends one JSON line per request to the file given:
{"id", "type", "valid", "body"}.

    python tests/support/webhook_receiver.py PORT OUT.jsonl
"""

from __future__ import annotations

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

SECRETS = os.environ["LETHE_TEST_WEBHOOK_SECRETS"].split()
OUT = sys.argv[2]


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("content-length", "0"))).decode()
        headers = {k.lower(): v for k, v in self.headers.items()}
        valid = False
        for secret in SECRETS:
            try:
                Webhook(secret).verify(body, headers)
                valid = True
                break
            except WebhookVerificationError:
                continue
        event = json.loads(body) if valid else {}
        line = {"id": headers.get("webhook-id"), "type": event.get("type"), "valid": valid,
                "content_type": headers.get("content-type"), "body": body}  # fmt: skip
        with open(OUT, "a") as fh:
            fh.write(json.dumps(line) + "\n")
        self.send_response(204 if valid else 401)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


if __name__ == "__main__":
    HTTPServer(("127.0.0.1", int(sys.argv[1])), Receiver).serve_forever()
