"""Polyhedral access analysis with islpy: the only module of aotune that imports islpy.

For a workload it builds the iteration domain and one access map per tensor, and derives from them
(with isl, not per operator by hand):

- the footprint of a rectangular tile: for each tensor dimension, its extent as an affine function
  of the tile sizes (isl ``dim_max - dim_min + 1`` of the tile's image under the access map);
- reuse: which loops leave each access invariant;
- strides: how far (in elements) one step of each loop moves each access in row-major memory;
- dependences: the loops that carry the reduction into the output;
- halos: how far an access reaches outside its tensor over the whole domain (a convolution's
  padding), which decides whether reads need guards or a padded copy.

Footprint extents are bounding boxes: exact when windows overlap or touch (stride <= dilated
kernel span), an upper bound when a strided access leaves gaps; ``exact_footprint_elements`` counts
the touched points with isl for concrete tile sizes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import islpy as isl
from aotune.analysis.workload import Access, Workload


@dataclass(frozen=True)
class LinearForm:
    """``sum(coeff * tile[loop]) + const``: an extent as a function of tile sizes."""

    terms: tuple[tuple[str, int], ...]
    const: int

    def evaluate(self, tiles: Mapping[str, int]) -> int:
        """The value at concrete tile sizes."""
        return sum(c * tiles[n] for n, c in self.terms) + self.const

    def __str__(self) -> str:
        parts = [f"{c}*T_{n}" if c != 1 else f"T_{n}" for n, c in self.terms]
        text = " + ".join(parts) or str(self.const)
        if parts and self.const:
            text += f" - {-self.const}" if self.const < 0 else f" + {self.const}"
        return text


@dataclass(frozen=True)
class TensorAccessInfo:
    """What isl says about one tensor's access."""

    tensor: str
    is_output: bool
    access_map: str
    extents: tuple[LinearForm, ...]  # per tensor dim, in tile-size parameters named like the loops
    invariant_loops: frozenset[str]  # loops whose iterations reuse the same elements
    strides: tuple[tuple[str, int], ...]  # loop -> element stride in row-major memory
    itemsize: int
    coefficients: tuple[
        tuple[tuple[str, int], ...], ...
    ] = ()  # per tensor dim: nonzero (loop, coeff)
    offsets: tuple[int, ...] = ()  # per tensor dim: the access's constant term
    halo: tuple[
        tuple[int, int], ...
    ] = ()  # per tensor dim: (below 0, above the end) reached by the access

    @property
    def reads_outside(self) -> bool:
        """Whether some iteration reads outside the tensor (those reads are zeros)."""
        return any(lo or hi for lo, hi in self.halo)

    def stride(self, loop: str) -> int:
        """Element stride of this access along ``loop``."""
        return dict(self.strides)[loop]

    def footprint_text(self) -> str:
        """The tile footprint as a product of per-dim extents in the tile sizes ``T_loop``."""
        return " x ".join(
            f"({e})" if len(e.terms) > 1 or (e.terms and e.const) else str(e) for e in self.extents
        )


@dataclass(frozen=True)
class AccessInfo:
    """Domain, access maps and derived facts of a workload."""

    domain: str
    tensors: tuple[TensorAccessInfo, ...]
    reduction_carried_by: frozenset[str]
    loop_names: tuple[str, ...] = ()

    def tensor(self, name: str) -> TensorAccessInfo:
        """The info of tensor ``name``."""
        for t in self.tensors:
            if t.tensor == name:
                return t
        raise KeyError(name)

    def footprint_elements(self, tensor: str, tiles: Mapping[str, int]) -> int:
        """Distinct elements of ``tensor`` touched by a tile with the given sizes per loop."""
        return math.prod(max(0, e.evaluate(tiles)) for e in self.tensor(tensor).extents)

    def exact_footprint_elements(self, tensor: str, tiles: Mapping[str, int]) -> int:
        """Distinct elements touched by the tile at the origin, counted by isl (no bounding box)."""
        t = self.tensor(tensor)
        box = " and ".join(f"0 <= {n} < {tiles[n]}" for n in self.loop_names)
        tile = isl.Set(f"{{ S[{', '.join(self.loop_names)}] : {box} }}")
        return int(tile.apply(isl.Map(t.access_map)).count_val().to_python())

    def footprint_bytes(
        self, tiles: Mapping[str, int], tensors: tuple[str, ...] | None = None
    ) -> int:
        """Bytes touched by a tile, summed over ``tensors`` (default: all)."""
        names = tensors if tensors is not None else tuple(t.tensor for t in self.tensors)
        return sum(self.footprint_elements(n, tiles) * self.tensor(n).itemsize for n in names)


def _domain_str(w: Workload) -> str:
    names = ", ".join(lp.name for lp in w.loops)
    bounds = " and ".join(f"0 <= {lp.name} < {lp.extent}" for lp in w.loops)
    return f"{{ S[{names}] : {bounds} }}"


def _access_str(w: Workload, acc: Access) -> str:
    names = ", ".join(lp.name for lp in w.loops)
    return f"{{ S[{names}] -> {acc.tensor}[{', '.join(map(str, acc.indices))}] }}"


def _tile_box(w: Workload) -> isl.Set:
    params = ", ".join(f"T_{lp.name}" for lp in w.loops)
    names = ", ".join(lp.name for lp in w.loops)
    bounds = " and ".join(f"0 <= {lp.name} < T_{lp.name}" for lp in w.loops)
    return isl.Set(f"[{params}] -> {{ S[{names}] : {bounds} }}")


def _single_aff(pw: isl.PwAff) -> isl.Aff:
    pieces = pw.get_pieces()
    if len(pieces) != 1:
        raise ValueError(f"expected one affine piece, isl gave {len(pieces)}: {pw}")
    return pieces[0][1]


def _linear_form(aff: isl.Aff) -> LinearForm:
    terms = []
    for i in range(aff.dim(isl.dim_type.param)):
        c = aff.get_coefficient_val(isl.dim_type.param, i).to_python()
        if c:
            name = aff.get_dim_name(isl.dim_type.param, i)
            terms.append((name.removeprefix("T_"), int(c)))
    return LinearForm(tuple(terms), int(aff.get_constant_val().to_python()))


def _coefficients(access_map: isl.Map, n_loops: int) -> list[list[int]]:
    """coeff[d][l]: how tensor dim d moves per step of loop l (from the map's affine form)."""
    ma = isl.PwMultiAff.from_map(access_map).as_multi_aff()
    out = []
    for d in range(ma.dim(isl.dim_type.out)):
        aff = ma.get_at(d)
        out.append(
            [
                int(aff.get_coefficient_val(isl.dim_type.in_, li).to_python())
                for li in range(n_loops)
            ]
        )
    return out


def _offsets(access_map: isl.Map) -> tuple[int, ...]:
    """The constant term of each tensor dim's affine index."""
    ma = isl.PwMultiAff.from_map(access_map).as_multi_aff()
    return tuple(
        int(ma.get_at(d).get_constant_val().to_python()) for d in range(ma.dim(isl.dim_type.out))
    )


def analyze(w: Workload) -> AccessInfo:
    """Access analysis of ``w`` (domain, footprint extents, reuse, strides, dependences)."""
    domain = _domain_str(w)
    box = _tile_box(w)
    loop_names = [lp.name for lp in w.loops]
    infos = []
    accesses = [(w.statement.output, True)] + [(a, False) for a in w.statement.inputs]
    for acc, is_output in accesses:
        amap_str = _access_str(w, acc)
        amap = isl.Map(amap_str)
        image = box.apply(
            amap.move_dims(isl.dim_type.param, 0, isl.dim_type.param, 0, 0).align_params(
                box.get_space()
            )
        )
        extents = []
        for d in range(image.dim(isl.dim_type.set)):
            hi = _linear_form(_single_aff(image.dim_max(d)))
            lo = _linear_form(_single_aff(image.dim_min(d)))
            terms = dict(hi.terms)
            for n, c in lo.terms:
                terms[n] = terms.get(n, 0) - c
            extents.append(
                LinearForm(tuple((n, c) for n, c in terms.items() if c), hi.const - lo.const + 1)
            )
        coeff = _coefficients(amap, len(loop_names))
        tensor = w.tensor(acc.tensor)
        row_strides = [math.prod(tensor.shape[d + 1 :]) for d in range(len(tensor.shape))]
        strides = tuple(
            (name, sum(coeff[d][li] * row_strides[d] for d in range(len(coeff))))
            for li, name in enumerate(loop_names)
        )
        invariant = frozenset(
            name
            for li, name in enumerate(loop_names)
            if all(coeff[d][li] == 0 for d in range(len(coeff)))
        )
        per_dim = tuple(
            tuple((name, coeff[d][li]) for li, name in enumerate(loop_names) if coeff[d][li])
            for d in range(len(coeff))
        )
        reach = isl.Set(domain).apply(amap)
        halo = []
        for d, size in enumerate(tensor.shape):
            lo = int(_single_aff(reach.dim_min(d)).get_constant_val().to_python())
            hi = int(_single_aff(reach.dim_max(d)).get_constant_val().to_python())
            halo.append((max(0, -lo), max(0, hi - (size - 1))))
        infos.append(
            TensorAccessInfo(
                acc.tensor,
                is_output,
                amap_str,
                tuple(extents),
                invariant,
                strides,
                tensor.itemsize,
                per_dim,
                _offsets(amap),
                tuple(halo),
            )
        )
    out_info = infos[0]
    carried = frozenset(
        lp.name for lp in w.loops if lp.kind == "reduction" and lp.name in out_info.invariant_loops
    )
    return AccessInfo(domain, tuple(infos), carried, tuple(loop_names))


def range_violation(
    variables: tuple[str, ...], condition: str, expr: str, low: int | None, high: int | None
) -> dict[str, int] | None:
    """A point of the integer set ``{ [variables] : condition }`` at which the affine ``expr``
    (isl syntax: ``floor(e/k)`` and ``e mod k`` allowed) lies outside ``[low, high]`` (None: no
    bound on that side), or None when isl proves there is none.

    The bounds proof of a GPU kernel (``analysis/gpu_bounds.py``) asks this of every access:
    ``low = 0`` and ``high = size - width`` of its buffer."""
    outside = [f"({expr}) < {low}"] if low is not None else []
    outside += [f"({expr}) > {high}"] if high is not None else []
    if not outside:
        return None
    names = ", ".join(variables)
    points = isl.Set(f"{{ [{names}] : ({condition}) and ({' or '.join(outside)}) }}")
    if points.is_empty():
        return None
    p = points.sample_point()
    return {
        n: int(p.get_coordinate_val(isl.dim_type.set, i).to_python())
        for i, n in enumerate(variables)
    }
