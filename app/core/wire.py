"""`lethe_client.wire` under its server name: the client distribution
(clients/python) owns the wire types and the client; the server uses the same
modules, so the two cannot drift."""

from lethe_client.wire import *  # noqa: F403
