"""The original checkpoint's (transformers') names for a decision model's parameters, and back:
how an exported folder (:mod:`variants.export`) names what it stores, and how its loaders
(:mod:`variants.checkpoints.packed`) put each stored tensor back in the module.

A **names map** ``{path: name}`` takes a path in the decision model (``DecisionModel.module``)
to the checkpoint's: a module path (``encoder.layers.0.attention.query`` ->
``bert.encoder.layer.0.attention.self.query``) when each of the module's parameters keeps its
last component (``weight``, ``bias``), else one entry per parameter. It is derived, not
written by hand:

- the encoder: a fresh skeleton filled the way ``load_checkpoint`` fills it, by the
  architecture loader's ``sanitize`` (:mod:`variants.checkpoints.architectures`) and the
  encoder's own ``load_weights``; a parameter that holds a checkpoint array unchanged (the same
  object) is named by its key (one key may feed several parameters: ALBERT's layers share one
  set, stored once; a variant that changed the copies differently is refused in one line);
- the checkpoint's classification head (``classifier`` in the decision model): the head
  ``load_head`` builds from the checkpoint's arrays, each head parameter matched to the key
  whose array it holds.

A parameter's name is its path's longest dotted prefix in the map, with the rest of the path
appended (:func:`name_of`). So a module a variant changed keeps its transformers path and adds
its own parameter names: a quantized Linear / Embedding ``<name>.weight`` (packed uint32),
``<name>.scales``, ``<name>.biases`` (``mlx.nn.quantize``'s, as mlx-lm and mlx-embeddings read
them); a factored Linear (:class:`variants.arch.lowrank.LowRankLinear`) ``<name>.down.weight``,
``<name>.up.weight``, ``<name>.up.bias``; an input-scaled one
(:class:`variants.arch.input_scaled.InputScaledLinear`) ``<name>.input_scale``,
``<name>.linear.weight`` (and its ``scales`` / ``biases``). Those last two have no transformers
layout: only this package's loaders read them. A parameter with no prefix in the map (a
decision head fitted here: ``head``, ``scorer``, a factory's own layers) has no transformers
name (None).
"""

from pathlib import Path

def _same(a, b):
    """Whether MLX arrays ``a`` and ``b`` hold the same values (shape, dtype and elements)."""
    import mlx.core as mx

    return a is b or (a.shape == b.shape and a.dtype == b.dtype
                      and bool(mx.array_equal(a, b).item()))


def encoder_names(loader, model_type, config, weights, prefix="encoder."):
    """``{parameter path: source key}`` of the encoder: a fresh skeleton of the architecture
    (``loader.build``) filled as :func:`variants.checkpoints.load.load_checkpoint` fills it
    (``loader.sanitize``, then the encoder's own ``load_weights``, which may place one array on
    several layers: ALBERT's shared groups); each parameter holding one of ``weights``' arrays
    (the same object: a rename) is named by its key, ``prefix`` prepended. ``weights``: the
    checkpoint's ``{key: mx.array}`` (lazy; nothing is read)."""
    from mlx.utils import tree_flatten

    _, skeleton = loader.build(model_type, config)
    skeleton.load_weights(list(loader.sanitize(weights).items()), strict=False)
    keys = {id(v): k for k, v in weights.items()}
    return {prefix + p: keys[id(a)] for p, a in tree_flatten(skeleton.parameters())
            if id(a) in keys}


def head_names(head, weights, prefix="classifier."):
    """``{parameter path: source key}`` of ``head`` (an ``nn.Module`` built by a loader's
    ``load_head`` from ``weights``): each parameter holding one of ``weights``' arrays (the same
    object) is named by its key."""
    from mlx.utils import tree_flatten

    keys = {id(v): k for k, v in weights.items()}
    return {prefix + p: keys[id(a)] for p, a in tree_flatten(head.parameters())
            if id(a) in keys}


def compact(param_names):
    """The names map of ``{parameter path: source key}``: one entry per module whose
    parameters all keep their last component under one transformers module path, one per
    parameter otherwise; sorted."""
    modules = {}
    for path, key in param_names.items():
        mod, _, leaf = path.rpartition(".")
        modules.setdefault(mod, []).append((path, leaf, key))
    out = {}
    for mod, params in modules.items():
        heads = {key.rpartition(".")[0] for _, _, key in params}
        if mod and len(heads) == 1 and all(key.rpartition(".")[2] == leaf
                                           for _, leaf, key in params):
            out[mod] = heads.pop()
        else:
            out.update({path: key for path, _, key in params})
    return dict(sorted(out.items()))


def _prefixes(path):
    """``path`` and each of its dotted prefixes, longest first."""
    while path:
        yield path
        path = path.rpartition(".")[0]


def name_of(path, names):
    """The transformers name of ``path`` (a parameter or module path of the decision model)
    under names map ``names``: its longest dotted prefix's entry plus the rest of the path;
    None when no prefix has one."""
    for p in _prefixes(path):
        if p in names:
            return names[p] + path[len(p):]
    return None


def invert(names):
    """``{transformers path: [decision-model paths]}`` of names map ``names`` (several paths
    where one stored tensor feeds shared layers)."""
    out = {}
    for path, name in names.items():
        out.setdefault(name, []).append(path)
    return out


def paths_of(name, inverse):
    """The decision-model paths a stored tensor ``name`` fills (:func:`invert`'s map
    ``inverse``): its longest dotted prefix's paths plus the rest of the name; [] when no
    prefix is in the map."""
    for p in _prefixes(name):
        if p in inverse:
            return [q + name[len(p):] for q in inverse[p]]
    return []


class _Reads(dict):
    """A dict that records which of its keys were read (``[]`` or ``get``): the tensors a
    loader's ``load_head`` needs, so an exported folder can rebuild the head's skeleton."""

    def __init__(self, *args):
        super().__init__(*args)
        self.read = set()

    def __getitem__(self, key):
        value = super().__getitem__(key)
        self.read.add(key)
        return value

    def get(self, key, default=None):
        if key in self:
            self.read.add(key)
        return super().get(key, default)


def checkpoint_names(checkpoint, with_head):
    """``(names, source, kept, head)`` of the reference ``checkpoint``
    (:class:`variants.checkpoints.load.Checkpoint`): its names map (:func:`compact`); its
    arrays ``{key: mx.array}`` as stored (lazy: read when used); the keys no decision-model
    parameter comes from (a pooler the model does not run, buffers such as ``position_ids``,
    an MLM head; with ``with_head`` False the classification head too), sorted; and
    ``{key: shape}`` of the classification head's tensors (what ``load_head`` reads; {} without
    ``with_head``). A checkpoint that is itself an exported folder gives its own map (a folder
    written before names were kept: its module paths, ``encoder`` and ``classifier`` named as
    themselves) and head shapes."""
    import json

    import mlx.core as mx

    from variants.checkpoints import architectures, files as files_

    path = Path(checkpoint.path)
    config = json.loads((path / "config.json").read_text())
    block = config.get("mlx_variants")
    if block is not None:  # an exported folder as the reference
        source = dict(mx.load(str(path / "model.safetensors")))
        names = dict(block.get("names") or {"encoder": "encoder", "classifier": "classifier"})
        if not with_head:
            names = {p: n for p, n in names.items()
                     if p != "classifier" and not p.startswith("classifier.")}
        inverse = invert(names)
        kept = [k for k in source if not paths_of(k, inverse)]
        head = dict(block.get("hf_head") or {}) if with_head else {}
        return dict(sorted(names.items())), source, sorted(kept), head
    source = {}
    for f in files_.weight_files(path):
        source.update(mx.load(str(f)))
    mt = files_.model_type(config, path / "config.json")
    loader = architectures.loader(mt)
    params = encoder_names(loader, mt, config, source)
    head = {}
    if with_head:
        reads = _Reads(source)
        module = loader.load_head(mt, reads, checkpoint.args)
        if module is not None:
            params.update(head_names(module, source))
            head = {k: list(source[k].shape) for k in sorted(reads.read)}
    used = set(params.values())
    return compact(params), source, sorted(k for k in source if k not in used), head


def split(params, names):
    """``(named, own)`` of a decision model's parameters ``params`` (``{path: mx.array}``):
    ``{transformers name: array}`` for those :func:`name_of` names (sorted) and
    ``{path: array}`` for the others (sorted).

    Raises
    ------
    ValueError
        Two paths under one name (layers sharing one stored tensor, as ALBERT's) hold
        different arrays: the variant changed the copies differently.
    """
    named, own, by = {}, {}, {}
    for path, arr in params.items():
        name = name_of(path, names)
        if name is None:
            own[path] = arr
        elif name in named and not _same(named[name], arr):
            raise ValueError(f"{by[name]} and {path} share the checkpoint's tensor {name} but "
                             "the variant changed them differently; export a variant that "
                             "treats shared layers alike")
        else:
            named[name], by[name] = arr, path
    return dict(sorted(named.items())), dict(sorted(own.items()))
