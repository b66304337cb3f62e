"""Reading a local Hugging Face checkpoint folder (no download, no ``transformers``): the
architecture from ``config.json``, the weights (one ``model.safetensors`` or shards listed in
``model.safetensors.index.json``) and the tokenizer decisions (max length, pad token) made
explicitly from ``tokenizer.json`` / ``tokenizer_config.json`` / ``config.json``.

Every problem raises :class:`CheckpointError` with one line naming the file and the fix.
"""

import hashlib
import json
from functools import lru_cache

import mlx.core as mx

from metrics._checks import short_repr
from runs.io import file_sha256

from variants.checkpoints import architectures

#: config.json ``model_type`` values a checkpoint may have
#: (:data:`variants.checkpoints.architectures.REGISTRY`)
SUPPORTED = architectures.supported()
#: tokenizer_config.json's "no limit set" (transformers' VERY_LARGE_INTEGER is 1e30)
_UNSET_MAX = 10 ** 12


class CheckpointError(RuntimeError):
    """A checkpoint is missing or malformed; the message says how to fix it."""


def read_json(f):
    """A JSON file's content; CheckpointError when it is missing or not JSON."""
    if not f.is_file():
        raise CheckpointError(f"{f} is missing; a checkpoint folder needs {f.name}")
    try:
        return json.loads(f.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{f} is not valid JSON ({short_repr(str(e))}); "
                              f"re-save it with save_pretrained") from None


def model_type(config, config_file):
    """The supported architecture named by ``config`` (``model_type``, else the first of
    ``architectures``). Raises CheckpointError naming the supported ones."""
    mt = config.get("model_type")
    if mt is None:
        mt = architectures.from_architectures(config.get("architectures") or [])
    if mt not in SUPPORTED:
        raise CheckpointError(f"{config_file} has model_type {short_repr(mt)}, which is not "
                              f"supported; use a checkpoint of one of: {', '.join(SUPPORTED)}")
    return mt


def id2label(config, config_file="config.json"):
    """config.json's ``id2label`` as a list of str in index order, or None. Raises
    CheckpointError when its keys are not 0..n-1."""
    m = config.get("id2label")
    if not isinstance(m, dict) or not m:
        return None
    if sorted(str(k) for k in m) != sorted(str(i) for i in range(len(m))):
        keys = sorted(map(str, m), key=lambda k: (len(k), k))
        raise CheckpointError(f"{config_file}: id2label keys {keys} are not 0..{len(m) - 1}; "
                              "number the labels from 0, one per logit")
    return [str(m.get(str(i), m.get(i))) for i in range(len(m))]


@lru_cache(maxsize=8)
def _file_sha(path, mtime_ns, size):
    return file_sha256(path)


def weight_files(folder):
    """The safetensors files of ``folder``: ``[model.safetensors]`` or the shards of
    ``model.safetensors.index.json`` (sorted). Raises CheckpointError when neither is there or
    a shard is missing."""
    single = folder / "model.safetensors"
    index = folder / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if not index.is_file():
        raise CheckpointError(f"{single} is missing; a checkpoint folder needs model.safetensors "
                              f"(or sharded files with model.safetensors.index.json)")
    wmap = read_json(index).get("weight_map")
    if not isinstance(wmap, dict) or not wmap:
        raise CheckpointError(f"{index} has no weight_map; re-save the checkpoint with "
                              f"save_pretrained")
    files = [folder / n for n in sorted(set(wmap.values()))]
    for f in files:
        if not f.is_file():
            raise CheckpointError(f"{f} is missing (listed in {index.name}); copy every shard "
                                  f"into {folder}")
    return files


def load_weights(files):
    """(weights dict name -> mx.array, sha256 hex). One file: its SHA-256 (as before shards);
    several: SHA-256 over the lines "name sha256" of each shard."""
    weights = {}
    shas = []
    for f in files:
        try:
            weights.update(mx.load(str(f)))
        except (ValueError, RuntimeError, OSError) as e:
            raise CheckpointError(f"{f} could not be read as safetensors "
                                  f"({short_repr(str(e))}); re-save it with save_pretrained") from None
        st = f.stat()
        shas.append(_file_sha(str(f), st.st_mtime_ns, st.st_size))
    if len(files) == 1:
        return weights, shas[0]
    blob = "\n".join(f"{f.name} {s}" for f, s in zip(files, shas))
    return weights, hashlib.sha256(blob.encode()).hexdigest()


def position_cap(mt, config):
    """The longest input the position table allows (the architecture's ``position_cap``:
    ``max_position_embeddings``, less ``pad_token_id + 1`` for RoBERTa / XLM-R)."""
    return architectures.position_cap(mt, config)


def _token_text(tok):
    return tok.get("content") if isinstance(tok, dict) else tok


def decide_tokenizer(folder, tokenizer, mt, config, max_length=None):
    """(max_length, pad_token, pad_id, decided) for the ``tokenizers.Tokenizer`` of ``folder``.

    max length: the user's ``max_length`` ((tokens, where it was set) e.g. ``(256,
    "--max-length")``; a CheckpointError when above :func:`position_cap`) if given, else
    tokenizer.json's baked truncation ``max_length`` if set, else tokenizer_config.json's
    ``model_max_length``, else the position table; capped by :func:`position_cap`. Pad token:
    tokenizer_config.json's ``pad_token``, else config.json's ``pad_token_id``, else
    tokenizer.json's padding token, else ``[PAD]``. ``decided`` says where each came from
    (recorded in run.json). Raises CheckpointError when the pad token is not in the
    vocabulary.
    """
    tc_file = folder / "tokenizer_config.json"
    tc = read_json(tc_file) if tc_file.is_file() else {}
    baked = json.loads(tokenizer.to_str()).get("truncation") or {}
    cap = position_cap(mt, config)
    if max_length is not None:
        ml, src = int(max_length[0]), str(max_length[1])
        if ml > cap:
            raise CheckpointError(f"{src} {ml} exceeds what {folder / 'config.json'} can read "
                                  f"({cap} tokens, its position table); pass at most {cap}")
    elif baked.get("max_length"):
        ml, src = int(baked["max_length"]), "tokenizer.json truncation.max_length"
    elif isinstance(tc.get("model_max_length"), (int, float)) and tc["model_max_length"] < _UNSET_MAX:
        ml, src = int(tc["model_max_length"]), "tokenizer_config.json model_max_length"
    else:
        ml, src = cap, "the position table (no limit in the tokenizer files)"
    if ml > cap:
        ml, src = cap, f"{src} ({ml}) capped by the position table"
    padded = json.loads(tokenizer.to_str()).get("padding") or {}
    if _token_text(tc.get("pad_token")):
        pad_token, psrc = _token_text(tc["pad_token"]), "tokenizer_config.json pad_token"
    elif config.get("pad_token_id") is not None:
        pad_token = tokenizer.id_to_token(int(config["pad_token_id"]))
        psrc = "config.json pad_token_id"
    elif padded.get("pad_token"):
        pad_token, psrc = padded["pad_token"], "tokenizer.json padding.pad_token"
    else:
        pad_token, psrc = "[PAD]", "default [PAD]"
    pad_id = tokenizer.token_to_id(pad_token) if pad_token is not None else None
    if pad_id is None:
        raise CheckpointError(f"{folder / 'tokenizer.json'} has no pad token {short_repr(pad_token)} "
                              f"(from {psrc}); set pad_token in tokenizer_config.json")
    decided = {"max_length": src, "pad_token": f"{pad_token} from {psrc}",
               "padding": "right side, longest in batch"}
    return ml, pad_token, int(pad_id), decided
