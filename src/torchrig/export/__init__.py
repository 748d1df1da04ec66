"""Export a training checkpoint (DDP or sharded FSDP, any number of ranks) to torch.export and ONNX, verified.

``export_checkpoint(path, out_dir)`` loads the DCP checkpoint into an unsharded model in this one process
(DCP reshards), writes ``model.pt2`` (``torch.export``) and ``model.onnx`` (``torch.onnx.export(...,
dynamo=True)``), then runs both on the same input and reports the largest absolute difference from the
eager PyTorch model (the ONNX file through onnxruntime).
"""

from torchrig.export.core import ExportResult, export_checkpoint

__all__ = ["ExportResult", "export_checkpoint"]
