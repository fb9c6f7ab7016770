"""Models shared by the ONNX tests (imported as `onnx_fixtures`; pytest puts tests/ on sys.path)."""

from __future__ import annotations

import torch


class Unexportable(torch.nn.Module):
    """Data-dependent Python control flow: torch.export (strict) cannot trace it."""

    def __init__(self, encoder: torch.nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, feats: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        if float(feats.mean()) > -1e9:
            return self.encoder(feats, lens)
        return self.encoder(feats.flip(1), lens)
