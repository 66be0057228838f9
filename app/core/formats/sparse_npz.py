"""A document-term matrix as a SciPy sparse archive (`X` in CSR parts, `y`, optional ids)."""

from __future__ import annotations

from app.core.formats import dataset_files
from app.core.formats.base import Format, Options


def parse(
    data: bytes, options: Options, limits: dataset_files.Limits
) -> dataset_files.ParsedDataset:
    return dataset_files.parse_sparse_npz(data, options.seed, options.test_fraction, limits)


FORMAT = Format(
    name="sparse_npz",
    suffixes=(),  # chosen by name: a sparse archive is an .npz too
    options=Options,
    parse=parse,
    summary="a sparse document-term matrix (SciPy's save_npz parts) with y",
    from_objects=False,
)
