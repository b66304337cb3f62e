"""The quant family's model check refuses a module whose layers are already quantized (what
``load_checkpoint`` gives for a folder written by ``variants export``) in one line naming the
first such layer and the fix, instead of MLX's "Only real floating types can be quantized"
mid-sweep; an fp32 module passes."""

import mlx.nn as nn
import pytest


class _Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Module()
        self.encoder.query = nn.Linear(64, 64)
        self.encoder.value = nn.Linear(64, 64)


def test_already_quantized_layer_is_refused_and_fp32_passes():
    from variants.families.quant.build import check_model
    from variants.families.quant.config import QuantConfig

    fp32 = _Tiny()
    check_model(fp32, [QuantConfig(bits=8)])  # no error
    packed = _Tiny()
    nn.quantize(packed, group_size=64, bits=8)
    assert isinstance(packed.encoder.query, nn.QuantizedLinear)
    with pytest.raises(ValueError) as e:
        check_model(packed, [QuantConfig(bits=4)])
    msg = str(e.value)
    assert "layer encoder.query is already quantized" in msg and "\n" not in msg, msg
    assert "pass the fp32 checkpoint it was exported from" in msg


def test_lowrank_refuses_an_already_quantized_layer_too():
    from variants.families.lowrank.build import check_model

    packed = _Tiny()
    nn.quantize(packed, group_size=64, bits=8)
    with pytest.raises(ValueError, match=r"layer encoder\.query is already quantized .*"
                                         r"--family lowrank builds from fp32 weights"):
        check_model(packed, [])
