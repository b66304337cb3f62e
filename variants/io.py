"""Moved to :mod:`runs.io` (issue 15); this shim keeps the old import path working."""

from runs.io import *  # noqa: F401,F403
from runs.io import (TEMP_FILE, RunIncomplete, WriteError, _atomic, _json_default,  # noqa: F401
                     digest, file_sha256, remove_temp_files, write_csv, write_json, write_npz,
                     write_text)
