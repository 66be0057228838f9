"""`lethe`'s entry point. `lethe serve` restarts itself once on the allocator that overwrites
what it frees (app/core/allocator.py); restarting here, before the CLI and its libraries are
imported, spares each server's start importing them twice (half a second of CPU)."""

from __future__ import annotations

import sys


def main() -> None:
    """A server restarted on the scrubbing allocator first, then the CLI (app/cli.py)."""
    if sys.argv[1:2] == ["serve"]:
        from app.core.allocator import restart_scrubbing

        restart_scrubbing()
    from app.cli import main as cli

    cli()


if __name__ == "__main__":
    main()
