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


@pytest.mark.parametrize("arch, what", [
    ("DistilBertForTokenClassification", "a per-token classifier"),
    ("DebertaV2ForMultipleChoice", "a multiple-choice scorer"),
    ("BertForQuestionAnswering", "a span extractor"),
])
def test_a_head_that_is_not_a_sequence_classifier_is_refused(tmp_path, arch, what):
    """A multiple-choice head loaded as a one-logit 'classifier' and a token classifier was
    refused as 'does not match config.json' (the wrong cause)."""
    folder = _folder(tmp_path, "bert", architectures=[arch])
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(folder)
    msg = str(e.value)
    assert "\n" not in msg and arch in msg and what in msg, msg


@pytest.mark.parametrize("name, edit, needle", [
    ("deberta_v3", {"position_buckets": "32"}, "has a value of the wrong type"),
    ("mpnet", {"vocab_size": ...}, "(missing 'vocab_size')"),
])
def test_a_malformed_config_names_what_is_wrong(tmp_path, name, edit, needle):
    folder = _folder(tmp_path, name, **edit)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(folder)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_half_precision_file_is_judged_in_float32(tmp_path, dtype):
    """The file's tensors are cast to float32 on load (run.json says float32): the logits are the
    float32 forward of the half-precision values, not a half-precision forward."""
    import mlx.core as mx
    import numpy as np

    ref = load_checkpoint(HF / "bert")
    folder = _folder(tmp_path, "bert")
    w = mx.load(str(folder / "model.safetensors"))
    half = {k: v.astype(getattr(mx, dtype)) if v.dtype == mx.float32 else v for k, v in w.items()}
    mx.save_safetensors(str(folder / "model.safetensors"), half)
    ck = load_checkpoint(folder)
    from mlx.utils import tree_flatten

    assert {p.dtype for _, p in tree_flatten(ck.encoder.parameters())} == {mx.float32}
    # the same as the float32 model whose weights were rounded to half precision
    ref.encoder.load_weights([(k, v.astype(getattr(mx, dtype)).astype(mx.float32))
                              for k, v in tree_flatten(ref.encoder.parameters())])
    r = np.load(HF / "bert" / "reference.npz")
    ids, mask = mx.array(r["input_ids"]), mx.array(r["attention_mask"])
    a = ck.encoder(ids, mask).last_hidden
    b = ref.encoder(ids, mask).last_hidden
    assert a.dtype == mx.float32
    assert float(mx.abs(a - b).max()) == 0.0
    logits = ck.classifier(a, mask)
    assert logits.dtype == mx.float32
