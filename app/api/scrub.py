"""After a request that carried personal data (an upload, a deletion's ids), zero the body
chunks the server handed over and those of the answer (which echoes the ids), and give free
pages back to the kernel.

Python frees a request's bytes without zeroing them, so an API process that parsed uploads
kept erased people's ids in free memory. Parsing now happens in a child process
(app/core/services/isolated.py); what this process still saw (the raw body) is wiped here once
the response is sent (a chunk something else still holds is left alone), and after an upload
`malloc_trim`, on a thread, returns the freed pages, which the kernel zeroes.
"""

from __future__ import annotations

import asyncio
import sys

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.services.isolated import trim, wipe

TRIM_AFTER_SECONDS = 0.5
SCRUBBED = (("POST", "/v1/datasets"), ("POST", "/v1/deletions"))


class ScrubMiddleware:
    """Wipes the body chunks of the requests in `SCRUBBED` once they are answered."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (scope["method"], scope["path"]) not in SCRUBBED:
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []

        def keep(message: Message) -> Message:
            body = message.get("body")
            if isinstance(body, bytes) and body:
                chunks.append(body)
            return message

        async def receiving() -> Message:
            return keep(await receive())

        async def sending(message: Message) -> None:  # the answer echoes the ids
            await send(keep(message))

        try:
            await self.app(scope, receiving, sending)
        finally:
            for chunk in chunks:
                if sys.getrefcount(chunk) <= 2:  # ours alone (a client's constant is not)
                    wipe(chunk)
            chunks.clear()
            if scope["path"] == "/v1/datasets":  # once the server dropped its buffers too
                loop = asyncio.get_running_loop()
                loop.call_later(TRIM_AFTER_SECONDS, lambda: loop.run_in_executor(None, trim))
