"""The jobs a worker runs, by the dotted names the queue carries (app/core/dispatch.py): each
takes the worker's JobContext (workers/context.py) first. Training is workers/training.py;
deletions (and the learning of appended rows after them) workers/deletions.py."""

from workers.deletions import process_deletions
from workers.training import train_model, warm_model

__all__ = ["process_deletions", "train_model", "warm_model"]
