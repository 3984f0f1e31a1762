"""One KV cache for the running batch: rows join by padding, leave by index selection.

The cache is a transformers `DynamicCache` of shape [rows, heads, T, dim]
per layer. Each row's real tokens are right-aligned; the columns to their
left are padding, masked out of attention. A row's position ids count its
real tokens only, so a padded row computes exactly what it would alone.
When rows leave, padding columns shared by every remaining row are cut.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

LayerKV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [1, H, L, D]


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


def _left_pad(t: torch.Tensor, columns: int) -> torch.Tensor:
    if columns == 0:
        return t
    shape = list(t.shape)
    shape[-2] = columns
    return torch.cat([t.new_zeros(shape), t], dim=-2)


def _last(t: torch.Tensor, length: int) -> torch.Tensor:
    """The last `length` columns (a row's real tokens)."""
    return t[..., t.shape[-2] - length :, :]


@dataclass(slots=True)
class RowGroup:
    """Rows to join the batch: KV of batch len(rows), real tokens right-aligned."""

    rows: list[str]
    layers: LayerKV
    lengths: list[int]


@dataclass(slots=True)
class ParkedKV:
    """A row's KV copied out of the batch (to host memory when the device is a GPU)."""

    layers: LayerKV
    length: int

    @property
    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.layers)


class BatchKV:
    def __init__(self, device: torch.device):
        self.device = device
        self.cache: DynamicCache | None = None
        self.rows: list[str] = []
        self.lengths: list[int] = []  # real tokens per row
        self._index: dict[str, int] = {}

    # -- views ----------------------------------------------------------------------
    def __contains__(self, row: str) -> bool:
        return row in self._index

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def width(self) -> int:
        """Columns of the cache, padding included."""
        return self.cache.get_seq_length() if self.cache is not None else 0

    @property
    def tokens(self) -> int:
        """Real KV tokens held (what the KV budget counts)."""
        return sum(self.lengths)

    @property
    def slots(self) -> int:
        """KV slots allocated, padding included."""
        return len(self.rows) * self.width

    def length_of(self, row: str) -> int:
        return self.lengths[self._index[row]]

    # -- one decode step ------------------------------------------------------------
    def decode_inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention mask [rows, T + 1] and position ids [rows, 1] for feeding one token a row."""
        width = self.width
        lengths = torch.tensor(self.lengths, device=self.device)
        columns = torch.arange(width + 1, device=self.device)
        mask = (columns.unsqueeze(0) >= (width - lengths).unsqueeze(1)).long()
        return mask, lengths.unsqueeze(1)

    def advanced(self) -> None:
        """The forward appended one real token to every row."""
        self.lengths = [n + 1 for n in self.lengths]

    # -- rows joining and leaving --------------------------------------------------
    def add(self, groups: list[RowGroup]) -> None:
        """Append groups of rows; each group's KV is left-padded like the batch's own."""
        groups = [g for g in groups if g.rows]
        if not groups:
            return
        current = [RowGroup(self.rows, layers_of(self.cache), self.lengths)] if self.cache is not None else []
        everything = current + groups
        width = max(max(g.lengths) for g in everything)
        merged: LayerKV = []
        for layer in range(len(groups[0].layers)):
            keys, values = [], []
            for g in everything:
                k, v = g.layers[layer]
                span = max(g.lengths)  # the group's own columns, less padding all its rows have
                keys.append(_left_pad(_last(k, span).to(self.device), width - span))
                values.append(_left_pad(_last(v, span).to(self.device), width - span))
            merged.append((torch.cat(keys, dim=0), torch.cat(values, dim=0)))
        self.cache = cache_from_layers(merged)
        for g in groups:
            for row, length in zip(g.rows, g.lengths, strict=True):
                self._index[row] = len(self.rows)
                self.rows.append(row)
                self.lengths.append(length)

    def remove(self, rows: set[str]) -> None:
        rows = rows & self._index.keys()
        if not rows:
            return
        keep = [i for i, row in enumerate(self.rows) if row not in rows]
        self.rows = [self.rows[i] for i in keep]
        self.lengths = [self.lengths[i] for i in keep]
        self._index = {row: i for i, row in enumerate(self.rows)}
        if not keep:
            self.cache = None
            return
        width = self.width
        cut = width - max(self.lengths)  # padding every remaining row has
        index = torch.tensor(keep, device=self.device)
        self.cache = cache_from_layers(
            [
                (k.index_select(0, index)[..., cut:, :], v.index_select(0, index)[..., cut:, :])
                for k, v in layers_of(self.cache)
            ]
        )

    def extract(self, row: str) -> ParkedKV:
        """One row's real KV, as views into the batch (copy them before the batch changes)."""
        i, length = self._index[row], self.length_of(row)
        layers = [
            (_last(k[i : i + 1], length), _last(v[i : i + 1], length)) for k, v in layers_of(self.cache)
        ]
        return ParkedKV(layers, length)
