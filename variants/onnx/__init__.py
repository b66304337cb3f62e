"""ONNX Runtime in the suite (issue #43): ONNX graphs built from the MLX modules with the
``onnx`` package (no PyTorch), and ONNX Runtime sessions standing in for an encoder so a
served model is judged by the same contract. Needs the ``onnx`` extra
(``pip install 'mlx-variants[onnx]'``)."""
