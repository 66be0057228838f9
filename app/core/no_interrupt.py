"""Imported first by the service's fork server (the upload parsers' parent, its preload):
a terminal's Ctrl-C is SIGINT to the whole process group, and it reached the fork server while
it imported, which printed a KeyboardInterrupt traceback. The service stops its children
itself; from this import on they ignore SIGINT (the fork server itself does so only after its
preload)."""

import signal

signal.signal(signal.SIGINT, signal.SIG_IGN)
