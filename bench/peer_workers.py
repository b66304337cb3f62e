"""Worker processes of bench/peers.py: our MLX forward (fp32 reference, native q8 / q4 g64 and
native W8A8),
PyTorch + transformers, and ONNX Runtime (fp32 and ``quantize_dynamic`` int8), one framework per
process (each brings its own thread pool; in one process they fight on 2 cores,
bench/blas_gemm.py). Every engine computes the same thing: the encoder's last hidden state,
mean-pooled over the mask and L2-normalised (sentence-transformers' embedding), on random ids
with a full mask.

The MLX worker runs under the package's interpreter; the ``torch`` and ``ort`` workers under the
interpreter that has the ``bench`` extra (torch, transformers, onnx, onnxruntime) and never import
``variants`` or ``mlx``. Protocol: one JSON request per line on stdin, one JSON answer per line
on stdout; ``ready`` first.
"""

import json
import os
import sys
import time

import numpy as np

THREADS = 2  # intra-op threads of every engine (this machine's cores)


def _ids(B, L, vocab, seed=0):
    return np.random.default_rng(seed).integers(1000, min(vocab, 30000), (B, L))


_LAST = {}  # (engine, B, L) -> median ms of its previous block
WARM_BELOW_MS = 500.0


def block(fn, iters, block_s, key=None):
    """One untimed call (wakes this process's pool after another worker's block; skipped when
    this ``key``'s previous block took >= WARM_BELOW_MS a call, where a wake-up is noise and
    the extra call would double the cost), then up to ``iters`` timed calls, stopping once
    ``block_s`` seconds have been spent (at least one); returns the list of ms."""
    if key is None or _LAST.get(key, 0.0) < WARM_BELOW_MS:
        fn()
    out, t_start = [], time.perf_counter()
    while len(out) < iters and (not out or time.perf_counter() - t_start < block_s):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    if key is not None:
        _LAST[key] = float(np.median(out))
    return out


# -- MLX ---------------------------------------------------------------------------------------
def w8a8_encoder(encoder):
    """A copy of ``encoder`` with every layer Linear a native W8A8
    :class:`variants.families.w8a8.build.Int8Linear` (int8 weights, per-token int8 activations, no
    SmoothQuant): our w8a8 variant's encoder (``layers.`` prefix of
    :func:`variants.arch.activations.target_linears`); BERT layers then run as one compiled op each
    (``fused-int8layer-cpp``), ModernBERT layers too (``fused-mbert-int8layer-cpp``)."""
    import copy

    import mlx.core as mx
    from variants.arch import activations
    from variants.families.w8a8.build import Int8Linear
    enc = copy.deepcopy(encoder)
    mods = dict(enc.named_modules())
    for p in activations.target_linears(enc, prefix="layers."):
        activations.set_module(enc, p, Int8Linear(mods[p], native=True))
    mx.eval(enc.parameters())
    return enc


def _kernel_of(encoder):
    """The kernels ``encoder``'s forward runs now (:func:`variants.sweep.timing.kernel`)."""
    from types import SimpleNamespace

    from variants.sweep import timing
    return timing.kernel(SimpleNamespace(module=encoder))


def _mlx_worker(path, arch, quant_bits=(8, 4), group_size=64, w8a8=False):
    import variants  # noqa: F401  (preloads OpenBLAS before mlx)
    import mlx.core as mx
    from variants.families.quant.build import QuantConfig, quantize_module
    from variants.checkpoints.load import load_checkpoint
    from variants.arch.encoder import mean_pool
    ck = load_checkpoint(path)
    encs = {"mlx": ck.encoder}
    for bits in quant_bits:
        q, _ = quantize_module(ck.encoder, QuantConfig(bits=bits, group_size=group_size),
                               mode="native")
        mx.eval(q.parameters())
        encs[f"q{bits}"] = q
    if w8a8:
        encs["w8a8"] = w8a8_encoder(ck.encoder)
    vocab = ck.args.vocab_size
    cache = {}

    def inputs(B, L):
        if (B, L) not in cache:
            ids = mx.array(_ids(B, L, vocab).astype(np.int32))
            cache[(B, L)] = (ids, mx.ones((B, L), mx.int32), mx.zeros((B, L), mx.int32))
        return cache[(B, L)]

    def time_(engine, B, L, iters, block_s):
        enc = encs[engine]
        ids, mask, types = inputs(B, L)
        return block(lambda: mx.eval(mean_pool(enc(ids, mask, types).last_hidden, mask)),
                     iters, block_s, (engine, B, L, len(enc.layers)))

    def layers(engine, B, L, counts, iters, block_s):
        """{k: median ms} of the forward cut to its first k layers (B=1 overhead analysis)."""
        enc, full = encs[engine], list(encs[engine].layers)
        out = {}
        try:
            for k in counts:
                enc.layers = full[:k]
                out[k] = float(np.median(time_(engine, B, L, iters, block_s)))
        finally:
            enc.layers = full
        return out

    def profile(n_texts, rounds):
        """Segment profile (variants/sweep/profile.py) of the reference at B = n_texts (MiniLM)."""
        from variants.datasets import bundled as data
        from variants.models import sentiment
        from variants.sweep.profile import segment_profile
        texts = list(data.sample(data.split_frame(data.load_vader(), "eval"), 64,
                                 seed=0)["text"])
        texts = sorted(texts, key=len)[len(texts) // 2:][:n_texts]
        return segment_profile(sentiment.build(ck), texts, rounds=rounds)

    def evals(B, L):
        """Graph evaluations and compiled calls of one reference forward (variants.sweep.work_counts)."""
        from variants.sweep.work_counts import count_work
        ids, mask, types = inputs(B, L)
        out = mean_pool(ck.encoder(ids, mask, types).last_hidden, mask)
        mx.eval(out)
        with count_work() as counts:
            out = mean_pool(ck.encoder(ids, mask, types).last_hidden, mask)
            mx.eval(out)
        return dict(counts)

    def embed(B, L):
        ids, mask, types = inputs(B, L)
        return np.array(mean_pool(ck.encoder(ids, mask, types).last_hidden, mask)).tolist()

    return {"time": time_, "layers": layers, "profile": profile, "evals": evals, "embed": embed,
            "info": lambda: {"mlx": mx.__version__, "layers": len(ck.encoder.layers),
                             "engines": list(encs), "kernels": {e: _kernel_of(m)
                                                                for e, m in encs.items()},
                             # how the int8 GEMMs are exact here (scheme, oneDNN's ISA)
                             "int8": _int8_record(encs)}}


def _int8_record(encs):
    from variants.runtime.int8_linear import int8_record

    return {e: int8_record(_kernel_of(m)) for e, m in encs.items() if int8_record(_kernel_of(m))}


# -- PyTorch / ONNX Runtime --------------------------------------------------------------------
def _torch_model(path, arch):
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch
    from transformers import BertModel, ModernBertModel

    class Embed(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids, mask):
            h = self.m(input_ids=ids, attention_mask=mask).last_hidden_state
            m = mask[..., None].to(h.dtype)
            p = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(p, dim=-1)

    kw = {"add_pooling_layer": False} if arch == "minilm" else {}
    cls = BertModel if arch == "minilm" else ModernBertModel
    # eval() on the wrapper: the exporter restores the wrapper's mode to every submodule after
    # export, so a wrapper left in training mode turns dropout on in the inner model
    return Embed(cls.from_pretrained(path, local_files_only=True, **kw)).eval()


def make_modernbert(folder, layers, seed=0):
    """Random-init ModernBERT at ModernBERT-base's shapes (hidden 768, 12 heads, intermediate
    1152, window 128, global every 3rd layer), seeded, saved with ``save_pretrained`` to
    ``folder`` with the test fixture's tokenizer (ids are random; the tokenizer only loads)."""
    import shutil

    import torch
    from transformers import ModernBertConfig, ModernBertModel
    torch.manual_seed(seed)
    cfg = ModernBertConfig(vocab_size=50368, hidden_size=768, num_hidden_layers=layers,
                           num_attention_heads=12, intermediate_size=1152, local_attention=128,
                           global_attn_every_n_layers=3, max_position_embeddings=8192,
                           pad_token_id=50283)
    ModernBertModel(cfg).eval().save_pretrained(folder)
    fx = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures",
                      "hf", "modernbert")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(fx, f), os.path.join(folder, f))
    return folder


def _torch_worker(path, arch):
    import torch
    torch.set_num_threads(THREADS)
    model = _torch_model(path, arch)
    vocab = model.m.config.vocab_size

    def time_(engine, B, L, iters, block_s):
        ids = torch.from_numpy(_ids(B, L, vocab))
        mask = torch.ones((B, L), dtype=torch.long)
        with torch.inference_mode():
            return block(lambda: model(ids, mask), iters, block_s, (engine, B, L))

    def embed(B, L):
        with torch.inference_mode():
            return model(torch.from_numpy(_ids(B, L, vocab)),
                         torch.ones((B, L), dtype=torch.long)).numpy().tolist()

    return {"time": time_, "embed": embed, "info": lambda: {"torch": torch.__version__,
                                            "threads": torch.get_num_threads(),
                                            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY")}}


def export_onnx(model, out, opset=17):
    """``torch.onnx.export`` (TorchScript exporter: the dynamo one needs onnxscript) of an
    ids/mask -> embedding module with dynamic batch and sequence axes."""
    import torch
    ids = torch.randint(5, 1000, (2, 16))
    mask = torch.ones((2, 16), dtype=torch.long)
    dyn = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
           "embedding": {0: "batch"}}
    with torch.no_grad():
        torch.onnx.export(model, (ids, mask), out, input_names=["input_ids", "attention_mask"],
                          output_names=["embedding"], dynamic_axes=dyn, opset_version=opset,
                          dynamo=False)
    return out


def _ort_worker(path, arch, workdir, spin=False):
    import onnxruntime as ort
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    torch.set_num_threads(THREADS)
    model = _torch_model(path, arch)
    vocab = model.m.config.vocab_size
    t0 = time.perf_counter()
    fp32 = export_onnx(model, os.path.join(workdir, f"{arch}.onnx"))
    int8 = os.path.join(workdir, f"{arch}.int8.onnx")
    quantize_dynamic(fp32, int8, weight_type=QuantType.QInt8)
    prep_s = time.perf_counter() - t0

    def session(f):
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = THREADS, 1
        # spin-waiting pools collapse when the cores are shared (B=1 L=24: 49 ms spinning,
        # 22 ms not, at load 6 on 2 cores); a dedicated server would keep the default (spin)
        so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
        return ort.InferenceSession(f, so, providers=["CPUExecutionProvider"])
    sessions = {"ort32": session(fp32), "ort8": session(int8)}

    def feed(B, L):
        return {"input_ids": _ids(B, L, vocab), "attention_mask": np.ones((B, L), np.int64)}

    def time_(engine, B, L, iters, block_s):
        s, f = sessions[engine], feed(B, L)
        return block(lambda: s.run(None, f), iters, block_s, (engine, B, L))

    cut = {}  # k -> session of the forward cut to its first k layers (exported once)

    def layers(engine, B, L, counts, iters, block_s):
        """{k: median ms} of the exported forward cut to its first k layers (fp32)."""
        enc = model.m.encoder if arch == "minilm" else model.m
        name = "layer" if arch == "minilm" else "layers"
        full, out = getattr(enc, name), {}
        for k in counts:
            if k not in cut:
                setattr(enc, name, torch.nn.ModuleList(list(full)[:k]))
                try:
                    cut[k] = session(export_onnx(model, os.path.join(workdir,
                                                                     f"{arch}.{k}layers.onnx")))
                finally:
                    setattr(enc, name, full)
            fd = feed(B, L)
            out[k] = float(np.median(block(lambda: cut[k].run(None, fd), iters, block_s)))
        return out

    def agree(B, L):
        """Max |ORT fp32 - torch| and |ORT int8 - torch| of the embeddings."""
        f = feed(B, L)
        with torch.inference_mode():
            ref = model(torch.from_numpy(f["input_ids"]), torch.from_numpy(f["attention_mask"]))
        return {k: float(np.abs(s.run(None, f)[0] - ref.numpy()).max())
                for k, s in sessions.items()}

    return {"time": time_, "layers": layers, "agree": agree,
            "info": lambda: {"onnxruntime": ort.__version__, "export_quantize_s": round(prep_s, 1),
                             "threads": THREADS, "spin": spin}}


def serve(kind, **kw):
    """Answer requests on stdin: ``{"op": name, **kwargs}`` -> JSON of ``ops[name](**kwargs)``."""
    out = sys.stdout
    sys.stdout = sys.stderr  # library prints must not corrupt the protocol
    if kind == "build":  # one-shot: the random-init ModernBERT folder
        out.write(json.dumps(make_modernbert(kw["path"], int(kw["layers"]))) + "\n")
        return
    ops = {"mlx": _mlx_worker, "torch": _torch_worker, "ort": _ort_worker}[kind](**kw)
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        req = json.loads(line)
        res = ops[req.pop("op")](**req)
        out.write(json.dumps(res) + "\n")
        out.flush()


if __name__ == "__main__":
    serve(sys.argv[1], **json.loads(sys.argv[2]))
