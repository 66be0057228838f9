"""NumPy archives: `X`, `y`, and optionally `ids`, `subjects` and `split` arrays."""

from __future__ import annotations

import io
import zipfile

from app.core.formats import dataset_files
from app.core.formats.base import Format, Options


class NpzOptions(Options):
    """An archive's options: the seeded split, unless it holds a `split` array."""

    def split_given(self, data: bytes) -> bool:
        """Whether the archive holds a `split` array (its member names only are read)."""
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                return "split.npy" in archive.namelist()
        except zipfile.BadZipFile:
            return False


def parse(
    data: bytes, options: NpzOptions, limits: dataset_files.Limits
) -> dataset_files.ParsedDataset:
    return dataset_files.parse_npz(data, options.seed, options.test_fraction, limits)


FORMAT = Format(
    name="npz",
    suffixes=(".npz",),
    options=NpzOptions,
    parse=parse,
    summary="a NumPy archive of X, y and optional ids, subjects and split",
)
