"""``variants verify``'s file check (variants.export.verify.check_files) on a hand-made folder:
every file in the folder must be listed in manifest.json with its SHA-256 (hashlib computed
here, independently); a manifest that lists fewer files than the folder holds (an emptied
``files``), or names a path outside the folder, is refused in one line naming the file."""

import hashlib
import json

import pytest


def _folder(tmp_path, files):
    d = tmp_path / "exp"
    (d / "judged").mkdir(parents=True)
    for name, text in files.items():
        (d / name).write_bytes(text)
    return d


def _manifest(d, listed):
    (d / "manifest.json").write_text(json.dumps({"format_version": 1, "files": listed}))


FILES = {"model.safetensors": b"weights", "config.json": b"{}", "judged/outputs.npz": b"npz"}
SHA = {k: hashlib.sha256(v).hexdigest() for k, v in FILES.items()}


def test_every_file_listed_and_matching_passes(tmp_path):
    from variants.export.verify import check_files

    d = _folder(tmp_path, FILES)
    _manifest(d, SHA)
    assert check_files(d)["files"] == SHA
    assert SHA["config.json"] == "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"


@pytest.mark.parametrize("listed, says", [
    ({}, "config.json is not listed in manifest.json"),  # emptied: nothing hashed
    ({k: v for k, v in SHA.items() if k != "judged/outputs.npz"},
     "judged/outputs.npz is not listed in manifest.json"),
    (dict(SHA, **{"../outside.txt": "0" * 64}), "names '../outside.txt', outside the folder"),
    (dict(SHA, **{"/etc/hostname": "0" * 64}), "names '/etc/hostname', outside the folder"),
])
def test_unlisted_file_or_a_path_outside_is_refused(tmp_path, listed, says):
    from variants.export.source import ExportError
    from variants.export.verify import check_files

    d = _folder(tmp_path, FILES)
    _manifest(d, listed)
    with pytest.raises(ExportError) as e:
        check_files(d)
    msg = str(e.value)
    assert says in msg and "\n" not in msg and "export" in msg, msg
