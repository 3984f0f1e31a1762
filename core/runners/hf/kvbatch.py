"""One KV cache for the running batch, in preallocated slots.

Per layer, keys and values live in buffers of [row slots, heads, columns,
dim]. The running rows are slots 0..B-1; every row's real tokens are
right-aligned under a common width T, and the columns to their left are
padding (zeroed, and masked out of attention). A row's position ids count
its real tokens only, so a padded row computes exactly what it would alone.

What a step costs beyond the model is O(what changed), not O(the batch):
- a decode step writes one column in place (buffers double when full);
- a joining row is written into a free slot;
- a leaving row's slot is refilled by moving the last row into it;
- padding every row shares is cut only when it grows large.

The model sees a transformers `DynamicCache` whose layers are views of the
buffers (`SlotLayer`); transformers 5.24 is pinned, and the engine tests
compare outputs with `generate` token for token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from fsched.core.types import RequestId

LayerKV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [rows, H, L, D]


def cache_from_layers(layers: LayerKV) -> DynamicCache:
    """A DynamicCache holding these very tensors (no copy).

    The public constructor copies what it is given; it is given empty slices
    instead, and its layers then take the tensors (transformers 5.24's
    DynamicLayer keeps them as `.keys` / `.values`; the version is pinned and
    the engine tests compare outputs with `generate`).
    """
    cache = DynamicCache(ddp_cache_data=[(k[..., :0, :], v[..., :0, :]) for k, v in layers])
    for layer, (k, v) in zip(cache.layers, layers, strict=True):
        layer.keys, layer.values = k, v
    return cache


def layers_of(cache: DynamicCache) -> LayerKV:
    return [(k, v) for k, v, *_ in cache]


@dataclass(slots=True)
class RowGroup:
    """Rows to join the batch: KV of batch len(rows), real tokens right-aligned."""

    rows: list[RequestId]
    layers: LayerKV
    lengths: list[int]


@dataclass(slots=True)
class ParkedKV:
    """A row's KV copied out of the batch (to host memory when the device is a GPU)."""

    layers: LayerKV
    length: int


class SlotLayer(DynamicLayer):
    """A cache layer over a BatchKV's buffers: a forward appends in place."""

    def __init__(self, batch: BatchKV, index: int):
        super().__init__()
        self.batch = batch
        self.index = index
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        b = self.batch
        kbuf, vbuf = b.buffers[self.index]
        end = b.width + key_states.shape[-2]
        kbuf[: len(b.rows), :, b.width : end, :] = key_states
        vbuf[: len(b.rows), :, b.width : end, :] = value_states
        return kbuf[: len(b.rows), :, :end, :], vbuf[: len(b.rows), :, :end, :]


class BatchKV:
    # Cut shared padding when it is at least this many columns and a quarter of the width.
    TRIM_COLUMNS = 32

    def __init__(self, device: torch.device):
        self.device = device
        self.buffers: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.rows: list[RequestId] = []
        self.lengths: list[int] = []  # real tokens per row
        self.width = 0  # columns in use, padding included
        self._index: dict[RequestId, int] = {}
        self.cache: DynamicCache | None = None

    # -- views ----------------------------------------------------------------------
    def __contains__(self, row: str) -> bool:
        return row in self._index

    @property
    def tokens(self) -> int:
        """Real KV tokens held (what the KV budget counts)."""
        return sum(self.lengths)

    def length_of(self, row: str) -> int:
        return self.lengths[self._index[row]]

    def _capacity(self) -> tuple[int, int]:
        k = self.buffers[0][0]
        return k.shape[0], k.shape[2]

    def _refresh(self) -> None:
        """Point the model-facing cache at the rows and columns in use."""
        if not self.rows:
            self.cache = None
            return
        if self.cache is None:
            self.cache = DynamicCache()
            self.cache.layers = [SlotLayer(self, i) for i in range(len(self.buffers))]
        n = len(self.rows)
        for layer, (k, v) in zip(self.cache.layers, self.buffers, strict=True):
            layer.keys, layer.values = k[:n, :, : self.width, :], v[:n, :, : self.width, :]

    # -- one decode step ------------------------------------------------------------
    def decode_inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention mask [rows, T + 1] and position ids [rows, 1] for feeding one token a row."""
        self._reserve(len(self.rows), self.width + 1)
        lengths = torch.tensor(self.lengths, device=self.device)
        columns = torch.arange(self.width + 1, device=self.device)
        mask = (columns.unsqueeze(0) >= (self.width - lengths).unsqueeze(1)).long()
        return mask, lengths.unsqueeze(1)

    def advanced(self) -> None:
        """The forward appended one real token to every row."""
        self.width += 1
        self.lengths = [n + 1 for n in self.lengths]
        self._refresh()

    # -- rows joining and leaving --------------------------------------------------
    def add(self, groups: list[RowGroup]) -> None:
        """Write the groups' rows into free slots; each group's KV is right-aligned."""
        groups = [g for g in groups if g.rows]
        if not groups:
            return
        if not self.buffers:
            self._allocate(groups[0].layers, rows=8, columns=64)
        longest = max(max(g.lengths) for g in groups)
        if longest > self.width:
            self._shift_right(longest - self.width)
        n = len(self.rows)
        self._reserve(n + sum(len(g.rows) for g in groups), self.width)
        for g in groups:
            span = g.layers[0][0].shape[-2]
            for j, (row, length) in enumerate(zip(g.rows, g.lengths, strict=True)):
                slot = len(self.rows)
                for (kbuf, vbuf), (k, v) in zip(self.buffers, g.layers, strict=True):
                    kbuf[slot, :, : self.width - length, :] = 0
                    vbuf[slot, :, : self.width - length, :] = 0
                    kbuf[slot, :, self.width - length : self.width, :] = k[j, :, span - length :, :]
                    vbuf[slot, :, self.width - length : self.width, :] = v[j, :, span - length :, :]
                self._index[row] = slot
                self.rows.append(row)
                self.lengths.append(length)
        self._refresh()

    def remove(self, rows: set[RequestId]) -> None:
        changed = False
        for row in rows:
            slot = self._index.pop(row, None)
            if slot is None:
                continue
            changed = True
            last = len(self.rows) - 1
            if slot != last:  # the last row moves into the hole: one row copied, not the batch
                for kbuf, vbuf in self.buffers:
                    kbuf[slot, :, : self.width, :] = kbuf[last, :, : self.width, :]
                    vbuf[slot, :, : self.width, :] = vbuf[last, :, : self.width, :]
                moved = self.rows[last]
                self.rows[slot], self.lengths[slot] = moved, self.lengths[last]
                self._index[moved] = slot
            self.rows.pop()
            self.lengths.pop()
        if not changed:
            return
        if not self.rows:
            self.width = 0
        else:
            shared = self.width - max(self.lengths)
            if shared >= self.TRIM_COLUMNS and 4 * shared >= self.width:
                self._shift_left(shared)
        self._refresh()

    def extract(self, row: str) -> ParkedKV:
        """One row's real KV, as views into the buffers (copy them before the batch changes)."""
        i, length = self._index[row], self.length_of(row)
        start = self.width - length
        layers = [(k[i : i + 1, :, start : self.width, :], v[i : i + 1, :, start : self.width, :])
                  for k, v in self.buffers]
        return ParkedKV(layers, length)

    # -- buffers ----------------------------------------------------------------------
    def _allocate(self, like: LayerKV, rows: int, columns: int) -> None:
        self.buffers = []
        for k, v in like:
            shape = (rows, k.shape[1], columns, k.shape[3])
            self.buffers.append((torch.zeros(shape, dtype=k.dtype, device=self.device),
                                 torch.zeros(shape, dtype=v.dtype, device=self.device)))

    def _reserve(self, rows: int, columns: int) -> None:
        """Grow the buffers (doubling) to hold `rows` slots of `columns`."""
        cap_rows, cap_cols = self._capacity()
        if rows <= cap_rows and columns <= cap_cols:
            return
        new_rows = max(rows, cap_rows * 2 if rows > cap_rows else cap_rows)
        new_cols = max(columns, cap_cols * 2 if columns > cap_cols else cap_cols)
        n = len(self.rows)
        grown = []
        for k, v in self.buffers:
            shape = (new_rows, k.shape[1], new_cols, k.shape[3])
            nk = torch.zeros(shape, dtype=k.dtype, device=self.device)
            nv = torch.zeros(shape, dtype=v.dtype, device=self.device)
            nk[:n, :, : self.width, :] = k[:n, :, : self.width, :]
            nv[:n, :, : self.width, :] = v[:n, :, : self.width, :]
            grown.append((nk, nv))
        self.buffers = grown
        if self.cache is not None:
            self.cache = None  # rebuilt over the new buffers
        self._refresh()

    def _shift_right(self, columns: int) -> None:
        """Widen by `columns` of padding on the left of every row."""
        n, width = len(self.rows), self.width
        self._reserve(max(n, 1), width + columns)
        for kbuf, vbuf in self.buffers:
            kbuf[:n, :, columns : columns + width, :] = kbuf[:n, :, :width, :].clone()
            vbuf[:n, :, columns : columns + width, :] = vbuf[:n, :, :width, :].clone()
            kbuf[:n, :, :columns, :] = 0
            vbuf[:n, :, :columns, :] = 0
        self.width = width + columns

    def _shift_left(self, columns: int) -> None:
        """Drop `columns` of padding that every row has."""
        n, width = len(self.rows), self.width
        for kbuf, vbuf in self.buffers:
            kbuf[:n, :, : width - columns, :] = kbuf[:n, :, columns:width, :].clone()
            vbuf[:n, :, : width - columns, :] = vbuf[:n, :, columns:width, :].clone()
        self.width = width - columns
