"""Plug your own MLX model into mlx-variants: implement `forward(batch) -> (B, K) logits`.

Run: .venv/bin/python examples/own_model.py
or sweep it like a bundled model (from the repository root; `build` is the factory: Checkpoint in,
DecisionModel out; it answers minilm-sentiment's question, negative / neutral / positive):
    .venv/bin/python -m variants sweep --model examples.own_model:build
"""

import variants  # noqa: F401  (first: loads OpenBLAS before mlx)
import mlx.core as mx
import mlx.nn as nn

from variants.datasets import bundled as data
from variants.families.quant.build import QuantConfig, build as quantize
from variants.checkpoints.load import load_checkpoint
from variants.models.decision import DecisionModel
from variants.arch.encoder import mean_pool
from variants.models.sentiment import make_taskset


class Prototypes(nn.Module):  # your network: anything mapping token ids to option logits
    def __init__(self, encoder, n_options=3):
        super().__init__()
        self.encoder, self.proto = encoder, nn.Linear(encoder.args.hidden_size, n_options)

    def __call__(self, ids, mask, types):
        hidden = self.encoder(ids, mask, types).last_hidden
        return self.proto(mean_pool(hidden, mask))


class MyModel(DecisionModel):
    name = "my-sentiment"

    def forward(self, batch):  # PreparedBatch -> (B, K) raw logits
        return self.module(batch.input_ids, batch.attention_mask, batch.token_type_ids)


def build(ck):
    """The factory `variants sweep --model examples.own_model:build` calls with the Checkpoint."""
    net = Prototypes(ck.encoder)
    # zero-shot prototypes: the embeddings of the three option wordings, scaled like minilm-choice
    enc, _ = ck.tokenizer.encode(["This is negative.", "This is neutral.", "This is positive."])
    ids, mask, types = (mx.array(a) for a in ck.tokenizer.batch(enc))
    net.proto.weight = 20.0 * mean_pool(ck.encoder(ids, mask, types).last_hidden, mask)
    net.proto.bias = mx.zeros((3,))
    return MyModel(net, ck.tokenizer)


if __name__ == "__main__":
    ck = load_checkpoint()
    frame = data.load_vader()
    cal, ev = (make_taskset(data.sample(data.split_frame(frame, s), 64)) for s in ("calibration", "eval"))
    model = build(ck)
    model.calibrate(cal)                               # one temperature per option count
    ref = model.outputs(ev)                            # DecisionOutputs
    var, info = quantize(model, QuantConfig(bits=4))   # any builder works on any DecisionModel
    out = var.outputs(ev)
    print(f"temperatures {model.temperatures}; 4-bit: {info['bits_per_weight']:.1f} bits/weight, "
          f"agreement {(ref.probs.argmax(1) == out.probs.argmax(1)).mean():.3f}")
