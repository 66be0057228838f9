"""`lethe_client.jsontypes` under its server name: the client distribution
(clients/python) owns the wire types and the client; the server uses the same
modules, so the two cannot drift."""

from lethe_client.jsontypes import *  # noqa: F403
