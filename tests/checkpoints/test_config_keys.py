"""config.json keys that change the computation and are not implemented are refused in one line
(variants.checkpoints.config_keys), through the loader and the CLI; the values that mean the
plain computation load as before."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from variants.checkpoints.load import CheckpointError, load_checkpoint

ROOT = Path(__file__).parents[2]
HF = ROOT / "tests" / "fixtures" / "hf"


def _folder(tmp_path, name, **changes):
    folder = tmp_path / name
    shutil.copytree(HF / name, folder)
    cfg = json.loads((folder / "config.json").read_text())
    for k, v in changes.items():
        if v is ...:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _yarn(cfg_name):
    cfg = json.loads((HF / cfg_name / "config.json").read_text())
    rp = cfg["rope_parameters"]
    rp["full_attention"] = dict(rp["full_attention"], rope_type="yarn", factor=4.0)
    return rp


@pytest.mark.parametrize("name, changes, needles", [
    ("bert", {"position_embedding_type": "relative_key"},
     ["position_embedding_type 'relative_key'", "absolute positions"]),
    ("roberta", {"position_embedding_type": "relative_key_query"},
     ["position_embedding_type 'relative_key_query'"]),
    ("bert", {"is_decoder": True}, ["is_decoder true"]),
    ("bert", {"add_cross_attention": True}, ["add_cross_attention true"]),
    ("modernbert", {"rope_parameters": _yarn("modernbert")},
     ["rope_parameters.full_attention.rope_type 'yarn'", "without rope scaling"]),
    ("modernbert", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
     ["rope_scaling 'linear'"]),
    ("modernbert", {"rope_scaling": {"type": "dynamic", "factor": 2.0}},
     ["rope_scaling 'dynamic'"]),
])
def test_an_unimplemented_key_is_refused_in_one_line(tmp_path, name, changes, needles):
    folder = _folder(tmp_path, name, **changes)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(folder)
    msg = str(e.value)
    assert "\n" not in msg and "config.json" in msg
    for n in needles:
        assert n in msg, msg


@pytest.mark.parametrize("name, changes", [
    ("bert", {"position_embedding_type": "absolute", "is_decoder": False,
              "add_cross_attention": False}),
    ("bert", {"position_embedding_type": ...}),
    ("modernbert", {"rope_scaling": None}),
])
def test_the_plain_values_load(tmp_path, name, changes):
    ck = load_checkpoint(_folder(tmp_path, name, **changes))
    assert ck.classifier is not None


def test_the_cli_refuses_it_with_exit_2_and_writes_nothing(tmp_path):
    folder = _folder(tmp_path, "bert", position_embedding_type="relative_key")
    toml = tmp_path / "model.toml"
    toml.write_text(f'name = "rel"\ncheckpoint = "{folder}"\nlogits = "classifier"\n'
                    'options = ["negative", "neutral", "positive"]\n')
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"text": f"row {i} was fine"}) + "\n" for i in range(30)))
    out = tmp_path / "runs"
    p = subprocess.run([sys.executable, "-m", "variants", "sweep", "--model-config", str(toml),
                        "--data", str(data), "--results-dir", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr[-2000:]
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "position_embedding_type 'relative_key'" in lines[0], p.stderr
    assert not out.exists() or not any(out.rglob("run.json"))
