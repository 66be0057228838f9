"""`lethe_client.states` under its server name: the client distribution
(clients/python) owns the wire types and the client; the server uses the same
modules, so the two cannot drift."""

from lethe_client.states import *  # noqa: F403
