"""Dataset files that come as Python pickles (CIFAR-100's batches, the Revisited Oxford/Paris ground
truth), read without letting them run code.

``pickle.load`` calls whatever a file names, so a tampered dataset file could run code as the user.
These files only ever hold containers, numbers, text and numpy arrays; ``load_data_pickle``
unpickles with an allowlist of exactly the numpy functions that rebuild an array and refuses any
other global as one ``UserError`` naming the file.
"""

from __future__ import annotations

import logging
import pickle
from pathlib import Path
from typing import Any

from modelupgrade.errors import UserError

log = logging.getLogger(__name__)

# (module, name) a numpy array or scalar is rebuilt from; numpy 2 moved numpy.core to numpy._core.
_ALLOWED = frozenset(
    (module, name)
    for core in ("numpy.core.multiarray", "numpy._core.multiarray")
    for module, name in ((core, "_reconstruct"), (core, "scalar"))
) | {
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    # Protocol-2 pickles written by Python 3 store bytes as _codecs.encode(text, "latin1").
    ("_codecs", "encode"),
}


class _DataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(
                f"it names {module}.{name}, which no dataset file needs (only numpy arrays, "
                "containers, numbers and text are read)"
            )
        return super().find_class(module, name)


def load_data_pickle(path: Path, what: str, encoding: str = "ASCII") -> Any:
    """The content of the pickled dataset file ``path`` (``what`` it is, for errors), read with
    the allowlist above; a corrupt, truncated or code-carrying file is a ``UserError``."""
    log.info("reading %s %s: a pickle, unpickled restricted to arrays and plain data", what, path)
    try:
        with open(path, "rb") as fh:
            return _DataUnpickler(fh, encoding=encoding).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as err:
        raise UserError(
            f"{what} {path} cannot be read: {err}",
            hint="download the file again from its source; a dataset pickle holds only arrays, "
            "lists, numbers and text",
        ) from None
