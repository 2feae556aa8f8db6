"""Token mixers and the encoder layer they sit in.

Legend: B batch, T tokens, C channels (the model width d), H heads (each owns C/H consecutive
channels), k kernel width (odd), p = (k − 1)/2, r dilation.

Every mixer maps x (B, T, C) and mask (B, T) bool (True on real tokens) to (B, T, C). The
convolutions zero the padding positions of their input first, so padding never reaches a real
position (a real token next to padding sees the zeros a sequence end would give it). Each
convolution has `forward` (fast) and `reference` (plain loops over positions and taps, for
tests); both compute the cross-correlation y[t] = Σ_j w[j] · x[t + r·(j − p)], zero outside 0..T−1.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def zero_padding(x: Tensor, mask: Tensor) -> Tensor:
    """x (B, T, C) with the padding positions set to 0."""
    return x.masked_fill(~mask.unsqueeze(-1), 0.0)


def headwise_reference(x: Tensor, w: Tensor) -> Tensor:
    """The slow, readable convolution behind LightConv and DynamicConv: x (B, T, C), kernels
    w (B, T, H, k) (one per position and head; LightConv's are the same at every position) →
    y (B, T, C) with y[t] = Σ_j w[t, h, j] · x[t + j − p] on the C/H channels of head h."""
    B, T, C = x.shape
    H, k = w.shape[2:]
    p = k // 2
    xh = x.view(B, T, H, C // H)  # (B, T, H, C/H)
    rows = []
    for t in range(T):
        y = torch.zeros_like(xh[:, 0])  # (B, H, C/H)
        for j in range(k):
            s = t + j - p
            if 0 <= s < T:
                y = y + w[:, t, :, j, None] * xh[:, s]
        rows.append(y.reshape(B, C))
    return torch.stack(rows, 1)


class LightConv(nn.Module):
    """LightConv (Wu et al. 2019): a depthwise convolution whose kernel W ∈ R^{H×k} is shared by
    the C/H channels of each head and softmax-normalised over its width; DropConnect on the
    normalised kernel (`weight_dropout`) while training."""

    def __init__(self, channels: int, heads: int, kernel_size: int, weight_dropout: float = 0.0):
        super().__init__()
        self.channels, self.heads, self.kernel_size = channels, heads, kernel_size
        self.weight_dropout = weight_dropout
        self.weight = nn.Parameter(torch.empty(heads, kernel_size))  # (H, k)
        nn.init.xavier_uniform_(self.weight)

    def kernel(self) -> Tensor:
        """(H, k): softmax over the width, then weight dropout (training only)."""
        return F.dropout(self.weight.softmax(-1), self.weight_dropout, self.training)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        x = zero_padding(x, mask)
        w = self.kernel().repeat_interleave(self.channels // self.heads, 0).unsqueeze(1)  # (C, 1, k)
        y = F.conv1d(x.transpose(1, 2), w, padding=self.kernel_size // 2, groups=self.channels)  # (B, C, T)
        return y.transpose(1, 2)

    def reference(self, x: Tensor, mask: Tensor) -> Tensor:
        B, T, _ = x.shape
        return headwise_reference(zero_padding(x, mask), self.kernel().expand(B, T, -1, -1))


class DynamicConv(nn.Module):
    """DynamicConv (Wu et al. 2019): LightConv whose kernel is predicted at every position t by a
    linear map of that position's input, f(x_t) ∈ R^{H×k}, softmax-normalised over the width. The
    fast path sums k shifted copies of the input (the band of the convolution), so time and memory
    are linear in T; no T×T matrix is formed."""

    def __init__(self, channels: int, heads: int, kernel_size: int, weight_dropout: float = 0.0):
        super().__init__()
        self.channels, self.heads, self.kernel_size = channels, heads, kernel_size
        self.weight_dropout = weight_dropout
        self.predict = nn.Linear(channels, heads * kernel_size)

    def kernel(self, x: Tensor) -> Tensor:
        """x (B, T, C) → (B, T, H, k): one softmax-normalised kernel per position and head."""
        w = self.predict(x).view(*x.shape[:2], self.heads, self.kernel_size).softmax(-1)
        return F.dropout(w, self.weight_dropout, self.training)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        x = zero_padding(x, mask)
        B, T, C = x.shape
        k, p = self.kernel_size, self.kernel_size // 2
        w = self.kernel(x).unsqueeze(-1)  # (B, T, H, k, 1)
        xh = F.pad(x, (0, 0, p, p)).view(B, T + 2 * p, self.heads, C // self.heads)  # (B, T+2p, H, C/H)
        y = w[:, :, :, 0] * xh[:, 0:T]
        for j in range(1, k):
            y = y + w[:, :, :, j] * xh[:, j:j + T]  # tap j reads position t + j − p
        return y.reshape(B, T, C)

    def reference(self, x: Tensor, mask: Tensor) -> Tensor:
        x = zero_padding(x, mask)
        return headwise_reference(x, self.kernel(x))


class DilatedConv(nn.Module):
    """A depthwise convolution (one k-tap kernel per channel, no normalisation) with dilation r:
    it reads positions t + r·(j − p), so its reach is r·p on each side."""

    def __init__(self, channels: int, kernel_size: int, dilation: int):
        super().__init__()
        self.channels, self.kernel_size, self.dilation = channels, kernel_size, dilation
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel_size))  # (C, 1, k), as nn.Conv1d
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        x = zero_padding(x, mask)
        y = F.conv1d(x.transpose(1, 2), self.weight, padding=self.dilation * (self.kernel_size // 2),
                     dilation=self.dilation, groups=self.channels)  # (B, C, T)
        return y.transpose(1, 2)

    def reference(self, x: Tensor, mask: Tensor) -> Tensor:
        x = zero_padding(x, mask)
        B, T, C = x.shape
        w, p, r = self.weight[:, 0], self.kernel_size // 2, self.dilation  # (C, k)
        rows = []
        for t in range(T):
            y = torch.zeros_like(x[:, 0])  # (B, C)
            for j in range(self.kernel_size):
                s = t + r * (j - p)
                if 0 <= s < T:
                    y = y + w[:, j] * x[:, s]
            rows.append(y)
        return torch.stack(rows, 1)


class ConvBlock(nn.Module):
    """X1 = W^I X ⊙ σ(W^S X) (gated linear unit), X2 = Conv(X1) (padding zeroed first), X3 = W^O X2."""

    def __init__(self, dim: int, conv: nn.Module):
        super().__init__()
        self.gate = nn.Linear(dim, 2 * dim)  # [W^I; W^S]
        self.conv = conv
        self.out = nn.Linear(dim, dim)       # W^O

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        x1 = F.glu(self.gate(x), -1)         # (B, T, C): first half ⊙ σ(second half)
        return self.out(self.conv(x1, mask))


class SelfAttention(nn.Module):
    """Multi-head self-attention (the Transformer baseline's mixer); padding keys are masked."""

    def __init__(self, dim: int, heads: int, dropout: float = 0.0):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)  # 3 × (B, H, T, C/H)
        keys = None if bool(mask.all()) else mask[:, None, None, :]  # (B, 1, 1, T) True = attend
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=keys,
                                           dropout_p=self.dropout if self.training else 0.0)  # (B, H, T, C/H)
        return self.out(y.transpose(1, 2).reshape(B, T, C))


class FeedForward(nn.Module):
    """Two-layer ReLU network applied at every position."""

    def __init__(self, dim: int, hidden: int, dropout: float = 0.0):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, dim))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class EncoderLayer(nn.Module):
    """X_A = LayerNorm(Mixer(X)) + X, X_B = LayerNorm(FFN(X_A)) + X_A (dropout on each branch)."""

    def __init__(self, dim: int, mixer: nn.Module, ffn_dim: int, dropout: float):
        super().__init__()
        self.mixer, self.norm1 = mixer, nn.LayerNorm(dim)
        self.ffn, self.norm2 = FeedForward(dim, ffn_dim, dropout), nn.LayerNorm(dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        x = x + self.drop(self.norm1(self.mixer(x, mask)))
        return x + self.drop(self.norm2(self.ffn(x)))
