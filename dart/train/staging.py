"""A state dict's host copy in one reusable buffer: page-locked on a CUDA host, so a version
leaves the GPU at the copy engine's speed instead of a pageable clone per tensor.

Measured on an H200 host (16.58 GB of 7B weights): a ``.to("cpu").clone()`` per tensor took
12.1 s (pageable memory, 1.37 GB/s); a copy into pinned memory 0.30 s. Pinning is slow to set up
(the driver locks every page), so the buffer is made once and refilled for every version.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

_ALIGN = 64
"""Byte alignment of each tensor in the buffer (any dtype's element size divides it)."""


class HostStaging:
    """One flat host buffer that state dicts of one layout are copied into, again and again.

    :meth:`copy` returns tensors that are views of the buffer: they stay valid until the next
    :meth:`copy` (which overwrites them), so a caller that keeps a state dict across copies needs
    a staging of its own (``Engine.full_state_dict()`` without one makes a fresh, owned copy).
    """

    def __init__(self, *, pin: bool | None = None) -> None:
        self.pin = torch.cuda.is_available() if pin is None else pin
        """Page-locked (``pin_memory``): only where CUDA is, the only place it speeds a copy."""
        self._buffer: torch.Tensor | None = None
        self._layout: list[tuple[str, torch.dtype, tuple[int, ...]]] = []
        self._views: dict[str, torch.Tensor] = {}

    @property
    def nbytes(self) -> int:
        return 0 if self._buffer is None else self._buffer.numel()

    def _lay_out(self, state: Mapping[str, torch.Tensor]) -> None:
        layout = [(k, v.dtype, tuple(v.shape)) for k, v in state.items()]
        if layout == self._layout:
            return
        offsets, end = [], 0
        for _, dtype, shape in layout:
            offsets.append(end)
            end += -(-(torch.Size(shape).numel() * dtype.itemsize) // _ALIGN) * _ALIGN
        self._buffer = None                          # the old buffer goes before the new one is made
        self._buffer = torch.empty(end, dtype=torch.uint8, pin_memory=self.pin)
        self._views = {
            name: self._buffer[off:off + torch.Size(shape).numel() * dtype.itemsize].view(dtype).view(shape)
            for (name, dtype, shape), off in zip(layout, offsets, strict=True)
        }
        self._layout = layout

    def copy(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``state``'s tensors copied into the buffer (laid out again only when names, dtypes or
        shapes change); device tensors are copied asynchronously and waited for once."""
        self._lay_out(state)
        on_device = False
        with torch.no_grad():
            for name, tensor in state.items():
                on_device |= tensor.device.type == "cuda"
                self._views[name].copy_(tensor.detach(), non_blocking=True)
        if on_device:
            torch.cuda.synchronize()
        return dict(self._views)
