"""Post-processing of released noisy values: least-squares tree consistency and Haar transforms, with exact variances.

Everything here is a public, deterministic function of already-released DP values, so it
costs no privacy. It is shared by the strategies (which pick designs) and by `Summary`
(which answers range counts and their standard errors from the released values).

Tree consistency (Hay et al., VLDB 2010, generalised). Released partition sums of a chain
of refining partitions form a laminar family of intervals, i.e. a tree (identical
intervals measured twice are merged by inverse-variance weighting). With independent
noise of known variance on every node, the generalised least-squares estimate of the
leaf sums is computed exactly in two passes: bottom-up, each node combines its own
measurement with the sum of its children's estimates (inverse-variance weights); top-down,
the difference between a parent's final estimate and its children's sum is spread over
the children in proportion to their variances. For any linear query q over the leaves,
Var(q . x_hat) is computed exactly by the adjoint (reverse-mode) of the same two passes:
var = sum_v (d(q . x_hat) / d y_v)^2 * var(y_v).

Size: the tree's two passes, their adjoint for arbitrary linear queries, and the per-depth
tables that answer contiguous ranges in O(depth x log nodes) share one node layout; split
apart, each would need the layout's invariants restated.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Sequence

import numpy as np
import numpy.typing as npt

from .errors import InvalidInputError

#: Variances below this are treated as this in the least-squares weights: such values are
#: exact for every practical purpose (discrete Laplace noise of scale < 0.05), and a zero
#: variance (which the sampler's variance formula returns at absurdly large epsilon) would
#: make the weights infinite.
MIN_VARIANCE = 1e-9

__all__ = [
    "MIN_VARIANCE",
    "IntervalTree",
    "haar_depth",
    "haar_forward",
    "haar_forward_prefix",
    "haar_inverse_prefix",
    "haar_prefix_adjoint",
    "haar_range_variance",
    "haar_nonnegative_prefix",
    "range_weights",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def range_weights(starts: npt.ArrayLike, domain_size: int, lo: npt.ArrayLike, hi: npt.ArrayLike) -> FloatArray:
    """Weights over the cells of a partition for ranges [lo, hi): the covered fraction of each cell.

    Returns a (len(lo), n_cells) matrix; row r times the cell values, spread uniformly over
    each cell's bins, gives the count of bins [lo[r], hi[r]).
    """
    s = np.asarray(starts, dtype=np.int64)
    e = np.append(s[1:], domain_size)
    lo_a = np.asarray(lo, dtype=np.int64).reshape(-1, 1)
    hi_a = np.asarray(hi, dtype=np.int64).reshape(-1, 1)
    overlap = np.clip(np.minimum(e[None, :], hi_a) - np.maximum(s[None, :], lo_a), 0, None)
    return np.asarray(overlap / (e - s)[None, :], dtype=np.float64)


@dataclass(frozen=True)
class _Depth:
    lo: IntArray  # first bin of each node at this depth (sorted)
    hi: IntArray  # one past the last bin
    y: FloatArray  # combined measurement
    prec: FloatArray  # precision (1 / variance) of y; > 0 for every node
    parent: IntArray  # index of the parent in the previous depth (-1 at depth 0)
    child_lo: IntArray  # children of node k are [child_lo[k], child_hi[k]) at the next depth
    child_hi: IntArray


_Nodes = tuple[list[_Depth], IntArray, IntArray, IntArray]


def _cumsum0(values: FloatArray) -> FloatArray:
    """Prefix sums with a leading 0: sum of values[i:j] is out[j] - out[i]."""
    return np.concatenate([np.zeros(1), np.cumsum(values)])


@dataclass(frozen=True)
class _RangeTable:
    """One depth's precomputed terms for `IntervalTree.range_variance` (see `IntervalTree._range_tables`)."""

    a: FloatArray  # subtree variance of a node with uniform weight f and incoming adjoint c: a c^2 + b c f + c f^2
    b: FloatArray
    c: FloatArray
    w: FloatArray  # own term: alpha^2 / precision
    beta: FloatArray  # 1 - alpha
    cell: npt.NDArray[np.bool_]  # the node is a cell (spread evenly over its bins)
    above: npt.NDArray[np.bool_]  # the node strictly contains cells
    cum_a: FloatArray  # prefix sums of a, b, c and share (with a leading 0)
    cum_b: FloatArray
    cum_c: FloatArray
    share: FloatArray  # the node's share of its parent's correction (0 at depth 0)
    cum_share: FloatArray

    @staticmethod
    def empty() -> "_RangeTable":
        z = np.zeros(0)
        f = np.zeros(0, dtype=bool)
        return _RangeTable(z, z, z, z, z, f, f, z, z, z, z, z)


def _finish_nodes(n: int, lo: IntArray, hi: IntArray, py: FloatArray, p: FloatArray, parent: IntArray,
                  depth: IntArray) -> _Nodes:
    """Per-depth arrays (sorted by lo) and a sorted key -> (depth, index) lookup of the unique nodes.

    Node ids index lo/hi/py/p/parent/depth; py and p are the summed prec * y and prec.
    """
    order = np.lexsort((lo, depth))
    max_depth = int(depth.max())
    bounds = np.searchsorted(depth[order], np.arange(max_depth + 2))
    pos = np.empty(lo.size, dtype=np.int64)  # node id -> index within its depth
    for d in range(max_depth + 1):
        pos[order[bounds[d]:bounds[d + 1]]] = np.arange(bounds[d + 1] - bounds[d])
    depths: list[_Depth] = []
    for d in range(max_depth + 1):
        ids = order[bounds[d]:bounds[d + 1]]
        par = np.where(parent[ids] >= 0, pos[np.maximum(parent[ids], 0)], -1).astype(np.int64)
        if d < max_depth:
            child_par = pos[parent[order[bounds[d + 1]:bounds[d + 2]]]]
            child_lo = np.searchsorted(child_par, np.arange(ids.size), side="left").astype(np.int64)
            child_hi = np.searchsorted(child_par, np.arange(ids.size), side="right").astype(np.int64)
        else:
            child_lo = child_hi = np.zeros(ids.size, dtype=np.int64)
        depths.append(_Depth(lo[ids], hi[ids], py[ids] / p[ids], p[ids], par, child_lo, child_hi))
    keys = lo * (n + 1) + hi
    by_key = np.argsort(keys, kind="stable")
    return depths, keys[by_key], depth[by_key], pos[by_key]


def _within(a: IntArray, b: IntArray) -> bool:
    """Whether every value of the increasing array `a` is in the increasing array `b` (a's boundaries are b's)."""
    at = np.searchsorted(b, a)
    return bool(np.all(at < b.size) and np.array_equal(b[np.minimum(at, b.size - 1)], a))


def _chain_nodes(n: int, parts: list[tuple[IntArray, FloatArray, FloatArray]]) -> _Nodes | None:
    """Unique measured intervals of a chain of refinements, vectorised; None if the partitions are no chain.

    Sorted coarse to fine, each partition refines the previous one. An interval equal to the
    one containing it in the previous partition is the same node (measurements combined);
    otherwise its parent is that containing interval (the smallest strictly containing one).
    """
    ordered = sorted(parts, key=lambda q: q[0].size)
    for (a, _, _), (b, _, _) in zip(ordered, ordered[1:]):
        if not np.isin(a, b, assume_unique=True).all():
            return None
    lo_l, hi_l, par_l, dep_l, mid_l, mpy_l, mp_l = [], [], [], [], [], [], []
    count = 0
    prev_s = prev_ids = prev_depth = np.zeros(0, dtype=np.int64)
    for s, v, var in ordered:
        e = np.append(s[1:], n)
        ids = np.empty(s.size, dtype=np.int64)
        cur_depth = np.empty(s.size, dtype=np.int64)
        if prev_s.size == 0:
            fresh = np.ones(s.size, dtype=bool)
            parent = np.full(s.size, -1, dtype=np.int64)
            depth = np.zeros(s.size, dtype=np.int64)
        else:
            cont = np.searchsorted(prev_s, s, side="right") - 1
            prev_e = np.append(prev_s[1:], n)
            same = (prev_s[cont] == s) & (prev_e[cont] == e)
            fresh = ~same
            ids[same] = prev_ids[cont[same]]
            cur_depth[same] = prev_depth[cont[same]]
            parent = prev_ids[cont[fresh]]
            depth = prev_depth[cont[fresh]] + 1
        k = int(fresh.sum())
        ids[fresh] = np.arange(count, count + k)
        cur_depth[fresh] = depth
        lo_l.append(s[fresh])
        hi_l.append(e[fresh])
        par_l.append(parent)
        dep_l.append(depth)
        mid_l.append(ids)
        mpy_l.append(v / var)
        mp_l.append(1.0 / var)
        count += k
        prev_s, prev_ids, prev_depth = s, ids, cur_depth
    mid = np.concatenate(mid_l)
    py = np.asarray(np.bincount(mid, weights=np.concatenate(mpy_l), minlength=count), dtype=np.float64)
    p = np.asarray(np.bincount(mid, weights=np.concatenate(mp_l), minlength=count), dtype=np.float64)
    return _finish_nodes(n, np.concatenate(lo_l), np.concatenate(hi_l), py, p, np.concatenate(par_l),
                         np.concatenate(dep_l))


def _laminar_nodes(n: int, parts: list[tuple[IntArray, FloatArray, FloatArray]], finest: IntArray) -> _Nodes:
    """The general construction for a laminar family that is not a chain (checks nesting and coverage)."""
    acc: dict[tuple[int, int], list[float]] = {}
    for s, v, var in parts:
        e = np.append(s[1:], n)
        for a, b, val, vv in zip(s.tolist(), e.tolist(), v.tolist(), var.tolist()):
            slot = acc.setdefault((a, b), [0.0, 0.0])
            slot[0] += val / vv
            slot[1] += 1.0 / vv
    keys = sorted(acc, key=lambda k: (k[0], -k[1]))
    # Parent of each interval: the innermost earlier interval containing it (laminar check).
    node = {k: i for i, k in enumerate(keys)}
    parent = np.full(len(keys), -1, dtype=np.int64)
    depth = np.zeros(len(keys), dtype=np.int64)
    stack: list[tuple[int, int]] = []
    for i, k in enumerate(keys):
        while stack and stack[-1][1] <= k[0]:
            stack.pop()
        if stack and not (stack[-1][0] <= k[0] and k[1] <= stack[-1][1]):
            raise InvalidInputError(
                f"released partitions do not nest: [{stack[-1][0]}, {stack[-1][1]}) and [{k[0]}, {k[1]}) overlap; "
                "each partition must refine the coarser ones"
            )
        parent[i] = node[stack[-1]] if stack else -1
        depth[i] = len(stack)
        stack.append(k)
    roots = [k for k, par in zip(keys, parent) if par < 0]
    if roots[0][0] != 0 or roots[-1][1] != n or any(a[1] != b[0] for a, b in zip(roots, roots[1:])):
        raise InvalidInputError("the coarsest released intervals do not cover the domain")
    fin_e = np.append(finest[1:], n)
    has_child = set(parent[parent >= 0].tolist())
    leaves = {k for i, k in enumerate(keys) if i not in has_child}
    if leaves != set(zip(finest.tolist(), fin_e.tolist())):
        raise InvalidInputError("the finest released partition must refine every other one")
    arr = np.array(keys, dtype=np.int64).reshape(-1, 2)
    sums = np.array([acc[k] for k in keys], dtype=np.float64).reshape(-1, 2)
    return _finish_nodes(n, arr[:, 0], arr[:, 1], sums[:, 0], sums[:, 1], parent, depth)


class IntervalTree:
    """Exact GLS over a laminar family of measured interval sums.

    `partitions` are released partition-sum measurements: (starts, values, variance per
    value). Together they must form a chain of refinements of [0, domain_size) (each one
    refines or is refined by every other), which is what hierarchical designs produce.
    Per-bin estimates spread the estimate of each cell of `cells` (a partition whose cells
    are all measured intervals; default: the finest partition) evenly over its bins.
    """

    def __init__(self, domain_size: int,
                 partitions: Sequence[tuple[npt.ArrayLike, npt.ArrayLike, float | npt.ArrayLike]],
                 cells: npt.ArrayLike | None = None) -> None:
        n, parts, built, cs, at = self._nodes(domain_size, partitions, cells)
        depths, node_keys, node_depth, node_index = built
        self.domain_size = n
        self._depths = depths
        self.leaf_starts = cs
        # Cells in bin order: (depth, index) of each node that is spread evenly.
        self._leaf_depth = node_depth[at]
        self._leaf_index = node_index[at]
        self._solve()

    @classmethod
    def check(cls, domain_size: int,
              partitions: Sequence[tuple[npt.ArrayLike, npt.ArrayLike, float | npt.ArrayLike]],
              cells: npt.ArrayLike | None = None) -> None:
        """InvalidInputError unless the tree could be built (nested partitions, cells among their intervals); keeps
        nothing, and solves nothing (a summary checks this when it is made and builds the tree when first asked).

        The usual shape, a chain of refinements whose finest partition is the cells, is checked on the starts
        alone (a few arrays of the finest partition's size: building the tree's nodes to check them took 1.2 GB
        at 4M partitions); anything else goes through the tree's own construction."""
        if not partitions:
            raise InvalidInputError("a tree estimate needs at least one released partition")
        n = int(domain_size)
        levels = []
        for starts, values, variance in partitions:
            st = np.asarray(starts, dtype=np.int64)
            if (st.size == 0 or st[0] != 0 or st[-1] >= n or np.shape(values) != st.shape
                    or np.any(st[1:] <= st[:-1])):
                raise InvalidInputError("each released partition needs increasing starts from 0 and one value per cell")
            var = np.asarray(variance, dtype=np.float64)
            if np.any(~np.isfinite(var)) or np.any(var < 0):
                raise InvalidInputError("released values need finite, non-negative noise variances")
            levels.append(st)
        ordered = sorted(levels, key=lambda a: a.size)
        chain = all(_within(a, b) for a, b in zip(ordered, ordered[1:]))
        if chain and (cells is None or np.array_equal(np.asarray(cells, dtype=np.int64), ordered[-1])):
            return
        cls._nodes(domain_size, partitions, cells)

    @staticmethod
    def _nodes(domain_size: int, partitions: Sequence[tuple[npt.ArrayLike, npt.ArrayLike, float | npt.ArrayLike]],
               cells: npt.ArrayLike | None) -> tuple[int, Any, Any, IntArray, IntArray]:
        if not partitions:
            raise InvalidInputError("a tree estimate needs at least one released partition")
        n = int(domain_size)
        parts: list[tuple[IntArray, FloatArray, FloatArray]] = []
        for starts, values, variance in partitions:
            s = np.asarray(starts, dtype=np.int64)
            v = np.asarray(values, dtype=np.float64)
            var = np.broadcast_to(np.asarray(variance, dtype=np.float64), v.shape)
            if s.size == 0 or s[0] != 0 or np.any(np.diff(s) <= 0) or s[-1] >= n or v.shape != s.shape:
                raise InvalidInputError("each released partition needs increasing starts from 0 and one value per cell")
            if np.any(~np.isfinite(var)) or np.any(var < 0):
                raise InvalidInputError("released values need finite, non-negative noise variances")
            parts.append((s, v, np.maximum(var, MIN_VARIANCE)))
        finest = max((p[0] for p in parts), key=lambda a: a.size)
        built = _chain_nodes(n, parts)
        if built is None:  # not a chain of refinements: the general laminar-family construction
            built = _laminar_nodes(n, parts, finest)
        node_keys = built[1]
        cs = finest if cells is None else np.asarray(cells, dtype=np.int64)
        ce = np.append(cs[1:], n)
        wanted = cs * (n + 1) + ce
        at = np.minimum(np.searchsorted(node_keys, wanted), max(node_keys.size - 1, 0))
        found = node_keys[at] == wanted
        if cs.size == 0 or cs[0] != 0 or not found.all():
            missing = [(int(a), int(b)) for a, b in zip(cs[~found][:1], ce[~found][:1])]
            raise InvalidInputError(
                f"the estimate's cells must be measured intervals; {int((~found).sum())} are not (first: {missing[:1]})"
            )
        return n, parts, built, cs, at

    # -- the two passes ------------------------------------------------------------
    @staticmethod
    def _segment_sum(values: FloatArray, lo: IntArray, hi: IntArray) -> FloatArray:
        """Sum of values[..., lo[k]:hi[k]] for each k (empty segments give 0), along the last axis."""
        c = np.concatenate([np.zeros(values.shape[:-1] + (1,)), np.cumsum(values, axis=-1)], axis=-1)
        return np.asarray(c[..., hi] - c[..., lo], dtype=np.float64)

    def _solve(self) -> None:
        ds = self._depths
        z: list[FloatArray] = [np.empty(0)] * len(ds)
        post: list[FloatArray] = [np.empty(0)] * len(ds)  # posterior precision of z
        csum: list[FloatArray] = [np.empty(0)] * len(ds)  # sum of children's z
        rvar: list[FloatArray] = [np.empty(0)] * len(ds)  # sum of children's 1/post
        alpha: list[FloatArray] = [np.empty(0)] * len(ds)  # weight of own y in z
        for d in range(len(ds) - 1, -1, -1):
            cur = ds[d]
            has = cur.child_hi > cur.child_lo
            if d + 1 < len(ds):
                c = self._segment_sum(z[d + 1], cur.child_lo, cur.child_hi)
                r = self._segment_sum(1.0 / post[d + 1], cur.child_lo, cur.child_hi)
            else:
                c = np.zeros(cur.y.size)
                r = np.zeros(cur.y.size)
            q = np.where(has, 1.0 / np.where(has, r, 1.0), 0.0)
            p = cur.prec
            z[d] = (p * cur.y + q * c) / (p + q)
            post[d] = p + q
            alpha[d] = p / (p + q)
            csum[d], rvar[d] = c, r
        x: list[FloatArray] = [np.empty(0)] * len(ds)
        x[0] = z[0]
        for d in range(1, len(ds)):
            par = ds[d].parent
            share = (1.0 / post[d]) / rvar[d - 1][par]
            x[d] = z[d] + share * (x[d - 1] - csum[d - 1])[par]
        self._z, self._post, self._csum, self._rvar, self._alpha, self._x = z, post, csum, rvar, alpha, x

    # -- estimates -----------------------------------------------------------------
    def leaf_estimates(self) -> FloatArray:
        """GLS estimates of the cells' sums, in bin order."""
        return np.array([self._x[d][i] for d, i in zip(self._leaf_depth.tolist(), self._leaf_index.tolist())])

    def bin_estimates(self) -> FloatArray:
        lengths = np.diff(np.append(self.leaf_starts, self.domain_size))
        return np.repeat(self.leaf_estimates() / lengths, lengths)

    def cell_variances(self) -> FloatArray:
        """Noise variance of each cell's estimate (the diagonal of its covariance), in O(nodes).

        Top-down smoother recursion: Var_w = u_w + (u_w / r_v)^2 * (Var_v - r_v) for a child
        w of v, with u_w the variance of w's bottom-up estimate and r_v that of the sum of
        v's children's bottom-up estimates.
        """
        ds = self._depths
        var: list[FloatArray] = [1.0 / self._post[0]]
        for d in range(1, len(ds)):
            par = ds[d].parent
            u = 1.0 / self._post[d]
            a = u / self._rvar[d - 1][par]
            var.append(u + a * a * (var[d - 1][par] - self._rvar[d - 1][par]))
        return np.array([var[d][i] for d, i in zip(self._leaf_depth.tolist(), self._leaf_index.tolist())])

    def query_variance(self, leaf_weights: npt.ArrayLike) -> FloatArray:
        """Exact noise variance of q . leaf_estimates for each row q of `leaf_weights` (adjoint pass)."""
        var = np.zeros(np.atleast_2d(np.asarray(leaf_weights)).shape[0])
        for d, ybar in enumerate(self._measurement_weights(leaf_weights)):
            var += np.sum(ybar**2 / self._depths[d].prec[None, :], axis=1)
        return var

    def query_terms(self, leaf_weights: npt.ArrayLike) -> tuple[FloatArray, FloatArray]:
        """q . leaf_estimates as a weighted sum of independent noisy node values, for one row q: (the weight of
        each measured node, the noise variance of its value), from the same adjoint pass as `query_variance`.
        A node measured more than once (the same interval at two levels) is one value of the combined variance:
        its noise is a mix of smaller-MGF parts, so a tail bound computed from it stays valid."""
        ybars = self._measurement_weights(np.asarray(leaf_weights, dtype=np.float64).reshape(1, -1))
        weights = np.concatenate([y[0] for y in ybars])
        variances = np.concatenate([1.0 / dd.prec for dd in self._depths])
        return weights, variances

    def _measurement_weights(self, leaf_weights: npt.ArrayLike) -> list[FloatArray]:
        """For each depth, d(q . leaf_estimates) / d y_v for every node v at it (rows: the queries q)."""
        qm = np.atleast_2d(np.asarray(leaf_weights, dtype=np.float64))
        if qm.shape[1] != self.leaf_starts.size:
            raise InvalidInputError(f"expected weights over {self.leaf_starts.size} cells, got {qm.shape[1]}")
        ds = self._depths
        nq = qm.shape[0]
        xbar = [np.zeros((nq, dd.y.size)) for dd in ds]
        for d in range(len(ds)):
            sel = self._leaf_depth == d
            if sel.any():
                xbar[d][:, self._leaf_index[sel]] += qm[:, sel]
        zbar = [np.zeros((nq, dd.y.size)) for dd in ds]
        cbar = [np.zeros((nq, dd.y.size)) for dd in ds]
        # Reverse of the top-down pass (deepest first).
        for d in range(len(ds) - 1, 0, -1):
            par = ds[d].parent
            share = (1.0 / self._post[d]) / self._rvar[d - 1][par]
            zbar[d] += xbar[d]
            contrib = xbar[d] * share[None, :]
            up = self._segment_sum(contrib, ds[d - 1].child_lo, ds[d - 1].child_hi)
            xbar[d - 1] += up
            cbar[d - 1] -= up
        zbar[0] += xbar[0]
        # Reverse of the bottom-up pass (root first).
        ybars = []
        for d in range(len(ds)):
            a = self._alpha[d]
            ybars.append(zbar[d] * a[None, :])
            if d + 1 < len(ds):
                cbar[d] += zbar[d] * (1.0 - a)[None, :]
                zbar[d + 1] += cbar[d][:, ds[d + 1].parent]
        return ybars

    # -- range variances in O(depths) per range ------------------------------------
    @cached_property
    def _range_tables(self) -> list[_RangeTable]:
        """Per-depth tables for `range_variance`, built once in O(nodes).

        For a node v whose cells all carry the same weight f, and a value c flowing into it
        from its parent in the adjoint's bottom-up reversal (`query_variance`), the noise
        variance contributed by v's subtree is the quadratic form A c^2 + B c f + C f^2;
        (A, B, C) follow bottom-up from the children's. A contiguous range makes every node
        uniform except those strictly containing lo or hi (at most two per depth), so its
        variance is those nodes' own terms plus prefix sums of (A, B, C) over runs of
        uniform siblings.
        """
        ds = self._depths
        nd = len(ds)
        cell = [np.zeros(dd.y.size, dtype=bool) for dd in ds]
        above = [np.zeros(dd.y.size, dtype=bool) for dd in ds]
        for d in range(nd):
            cell[d][self._leaf_index[self._leaf_depth == d]] = True
        for d in range(nd - 1, 0, -1):
            up = cell[d] | above[d]
            above[d - 1][ds[d].parent[up]] = True
        tables: list[_RangeTable] = [_RangeTable.empty()] * nd
        for d in range(nd - 1, -1, -1):
            cur = ds[d]
            alpha = self._alpha[d]
            w = alpha * alpha / cur.prec
            beta = 1.0 - alpha
            h = (cell[d] | above[d]).astype(np.float64)
            u = above[d].astype(np.float64)
            e = h * beta - u
            if d + 1 < nd:
                nxt = tables[d + 1]
                sa = nxt.cum_a[cur.child_hi] - nxt.cum_a[cur.child_lo]
                sb = nxt.cum_b[cur.child_hi] - nxt.cum_b[cur.child_lo]
                sc = nxt.cum_c[cur.child_hi] - nxt.cum_c[cur.child_lo]
            else:
                sa = sb = sc = np.zeros(cur.y.size)
            a = w + sa * beta * beta
            b = 2.0 * w * h + 2.0 * sa * beta * e + sb * beta
            c = w * h * h + sa * e * e + sb * e + sc
            if d > 0:
                share = (1.0 / self._post[d]) / self._rvar[d - 1][cur.parent]
            else:
                share = np.zeros(cur.y.size)
            tables[d] = _RangeTable(a=a, b=b, c=c, w=w, beta=beta, cell=cell[d], above=above[d],
                                    cum_a=_cumsum0(a), cum_b=_cumsum0(b), cum_c=_cumsum0(c),
                                    share=share, cum_share=_cumsum0(share))
        return tables

    def range_variance(self, lo: npt.ArrayLike, hi: npt.ArrayLike) -> FloatArray:
        """Noise variance of the estimated counts of bins [lo, hi) (uniform spreading inside leaves).

        Exactly `query_variance` of the ranges' cell weights (`range_weights`), without forming
        them: O(depths * log nodes) per range, vectorised over the ranges (see `_range_tables`).
        """
        lo_a = np.atleast_1d(np.asarray(lo, dtype=np.int64))
        hi_a = np.atleast_1d(np.asarray(hi, dtype=np.int64))
        if lo_a.shape != hi_a.shape or np.any(lo_a < 0) or np.any(lo_a >= hi_a) or np.any(hi_a > self.domain_size):
            raise InvalidInputError(f"ranges must satisfy 0 <= lo < hi <= {self.domain_size}")
        ds, tabs = self._depths, self._range_tables
        nd, nq = len(ds), lo_a.size
        ends = (lo_a, hi_a)
        # The node strictly containing each end at each depth (valid[s][d]), its index, and its weight f / xbar.
        idx = [[np.zeros(nq, dtype=np.int64)] * nd for _ in ends]
        valid = [[np.zeros(nq, dtype=bool)] * nd for _ in ends]
        for s, p in enumerate(ends):
            for d in range(nd):
                i = np.maximum(np.searchsorted(ds[d].lo, p, side="right") - 1, 0)
                idx[s][d] = i
                valid[s][d] = (ds[d].lo[i] < p) & (p < ds[d].hi[i])
        same = [valid[0][d] & valid[1][d] & (idx[0][d] == idx[1][d]) for d in range(nd)]
        # Runs at each depth: nodes ending at or before lo [0, k1); inside [lo, hi): [j1, j2); starting at or after
        # hi: [k2, size).
        runs = []
        for d in range(nd):
            runs.append((np.searchsorted(ds[d].hi, lo_a, side="right"), np.searchsorted(ds[d].lo, lo_a, side="left"),
                         np.searchsorted(ds[d].hi, hi_a, side="right"), np.searchsorted(ds[d].lo, hi_a, side="left")))

        def frac(d: int, i: IntArray) -> FloatArray:
            a, b = ds[d].lo[i], ds[d].hi[i]
            return np.asarray((np.minimum(b, hi_a) - np.maximum(a, lo_a)) / (b - a), dtype=np.float64)

        # Bottom-up: xbar of every cut node strictly above the cells (a cut cell's xbar is its covered fraction).
        xbar = [[np.zeros(nq)] * nd for _ in ends]
        for d in range(nd - 1, -1, -1):
            t = tabs[d]
            for s in (0, 1):
                i = idx[s][d]
                explicit = valid[s][d] & t.above[i]
                if s == 1:
                    explicit &= ~same[d]
                x = np.where(valid[s][d] & t.cell[i], frac(d, i), 0.0)
                if d + 1 < nd and explicit.any():
                    nt = tabs[d + 1]
                    cl, ch = ds[d].child_lo[i], ds[d].child_hi[i]
                    _, j1, j2, _ = runs[d + 1]
                    a0, a1 = np.maximum(cl, j1), np.minimum(ch, j2)
                    up = np.where(a1 > a0, nt.cum_share[np.maximum(a1, a0)] - nt.cum_share[a0], 0.0)
                    # The cut child at this end is this node's; when this node cuts both ends (same), so is the
                    # other end's cut child unless it is the same child.
                    sides = ((s, np.ones(nq, dtype=bool)),) if s == 1 else ((0, np.ones(nq, dtype=bool)),
                                                                             (1, same[d] & ~same[d + 1]))
                    for c_side, own in sides:
                        ci = idx[c_side][d + 1]
                        take = own & valid[c_side][d + 1]
                        up = up + np.where(take, nt.share[ci] * xbar[c_side][d + 1], 0.0)
                    x = np.where(explicit, up, x)
                xbar[s][d] = x
        # Top-down: the cut nodes' own terms and their uniform children's quadratic forms.
        var = np.zeros(nq)
        t0 = tabs[0]
        _, j1, j2, _ = runs[0]
        var += t0.cum_c[np.maximum(j2, j1)] - t0.cum_c[j1]  # whole roots inside the range (c = 0, f = 1)
        incoming = [np.zeros(nq), np.zeros(nq)]
        for s in (0, 1):  # cut roots that are cells: C f^2
            i = idx[s][0]
            cut_cell = valid[s][0] & t0.cell[i] & (~same[0] if s == 1 else True)
            var += np.where(cut_cell, t0.c[i] * xbar[s][0] ** 2, 0.0)
        for d in range(nd):
            t = tabs[d]
            cbar = [np.zeros(nq), np.zeros(nq)]
            for s in (0, 1):
                i = idx[s][d]
                explicit = valid[s][d] & t.above[i]
                if s == 1:
                    explicit &= ~same[d]
                if not explicit.any():
                    if s == 1:
                        cbar[1] = np.where(same[d], cbar[0], 0.0)
                    continue
                z = xbar[s][d] + incoming[s]
                cb = z * t.beta[i] - xbar[s][d]
                var += np.where(explicit, t.w[i] * z * z, 0.0)
                cbar[s] = np.where(explicit, cb, 0.0)
                if s == 1:
                    cbar[1] = np.where(same[d], cbar[0], cbar[1])
                if d + 1 == nd:
                    continue
                nt = tabs[d + 1]
                cl, ch = ds[d].child_lo[i], ds[d].child_hi[i]
                k1, j1, j2, k2 = runs[d + 1]
                a0, a1 = np.maximum(cl, j1), np.minimum(ch, j2)
                a1 = np.maximum(a1, a0)
                l1 = np.maximum(np.minimum(ch, k1), cl)
                r0 = np.minimum(np.maximum(cl, k2), ch)
                sa_out = (nt.cum_a[l1] - nt.cum_a[cl]) + (nt.cum_a[ch] - nt.cum_a[r0])
                inside = cb * cb * (nt.cum_a[a1] - nt.cum_a[a0]) + cb * (nt.cum_b[a1] - nt.cum_b[a0]) \
                    + (nt.cum_c[a1] - nt.cum_c[a0])
                var += np.where(explicit, cb * cb * sa_out + inside, 0.0)
            if d + 1 == nd:
                break
            nt = tabs[d + 1]
            for s in (0, 1):  # the cut children: cells add their quadratic form, nodes above cells take cbar
                ci = idx[s][d + 1]
                ok = valid[s][d + 1]
                if s == 1:
                    ok = ok & ~same[d + 1]
                f = xbar[s][d + 1]
                cb = cbar[s]
                var += np.where(ok & nt.cell[ci], nt.a[ci] * cb * cb + nt.b[ci] * cb * f + nt.c[ci] * f * f, 0.0)
                incoming[s] = np.where(ok, cb, 0.0)
        return var


# -- Haar wavelet (Privelet) ----------------------------------------------------------
#
# Tree: the dyadic binary tree over [0, 2^L), L = ceil(log2 n), restricted to [0, n) with
# unary nodes collapsed. Internal nodes are in one-to-one correspondence with midpoints
# m in 1..n-1: the node of height h = 1 + trailing_zeros(m) spans [m - 2^(h-1),
# min(m + 2^(h-1), n)). Coefficient layout (length n, aligned with the prefix slots):
# w[m - 1] = S[a, m) - S[m, b) (left minus right sum, unnormalised), w[n - 1] = total.


def haar_depth(n: int) -> int:
    """L = ceil(log2 n): the number of detail coefficients a single bin contributes to, at most."""
    if n < 1:
        raise InvalidInputError(f"domain size must be >= 1, got {n}")
    return int(n - 1).bit_length()


def _haar_nodes(n: int) -> list[tuple[int, IntArray, IntArray, IntArray]]:
    """(height, a, m, b) arrays per height, from the top (largest) down."""
    out = []
    for h in range(haar_depth(n), 0, -1):
        half = 1 << (h - 1)
        m = np.arange(half, n, 2 * half, dtype=np.int64)
        if m.size:
            out.append((h, m - half, m, np.minimum(m + half, n)))
    return out


def haar_forward_prefix(prefix: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Haar coefficients from inclusive prefix sums P (P[i] = x[0] + ... + x[i]); exact for integers."""
    p = np.asarray(prefix)
    n = p.size
    pp = np.concatenate([np.zeros(1, dtype=p.dtype), p])  # pp[k] = P[k - 1], pp[0] = 0
    w = np.zeros(n, dtype=p.dtype)
    w[n - 1] = pp[n]
    for _, a, m, b in _haar_nodes(n):
        w[m - 1] = 2 * pp[m] - pp[a] - pp[b]
    return w


def haar_forward(x: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Haar coefficients of a histogram x."""
    return haar_forward_prefix(np.cumsum(np.asarray(x)))


def haar_inverse_prefix(w: npt.ArrayLike) -> FloatArray:
    """Prefix sums P from coefficients (inverse of `haar_forward_prefix`; rational, computed in floats)."""
    c = np.asarray(w, dtype=np.float64)
    n = c.size
    pp = np.zeros(n + 1)
    pp[n] = c[n - 1]
    for _, a, m, b in _haar_nodes(n):
        pp[m] = (c[m - 1] + pp[a] + pp[b]) / 2.0
    return pp[1:]


def haar_prefix_adjoint(g: npt.ArrayLike) -> FloatArray:
    """Transpose of `haar_inverse_prefix`: maps a weight vector on P to one on the coefficients.

    For a linear query q . x = g . P (g the query's weights on prefix sums), the estimate
    from noisy coefficients has variance var * ||haar_prefix_adjoint(g)||^2.
    """
    gp = np.concatenate([[0.0], np.asarray(g, dtype=np.float64)])  # adjoint of pp
    n = gp.size - 1
    cbar = np.zeros(n)
    for _, a, m, b in reversed(_haar_nodes(n)):
        t = gp[m] / 2.0
        cbar[m - 1] += t
        np.add.at(gp, a, t)
        np.add.at(gp, b, t)
        gp[m] = 0.0
    cbar[n - 1] += gp[n]
    return cbar


def _haar_prefix_rows(n: int, k: IntArray) -> FloatArray:
    """Rows of the linear map coefficients -> pp[k] (pp = prefix sums with pp[0] = 0), one per position k.

    pp[k] depends only on the total and on the nodes strictly containing k or with midpoint k: at
    most one node per height. Column 0 is the total's weight, column h the weight of the node of
    height h on k's path (0 where there is none). Walks the heights top-down, vectorised over k.
    """
    depth = haar_depth(n)
    rows = np.zeros((k.size, depth + 1))
    ra = np.zeros((k.size, depth + 1))  # row of pp[a], pp[b] for the current bracket [a, b] around k
    rb = np.zeros((k.size, depth + 1))
    rb[:, 0] = 1.0
    rows[k == n, 0] = 1.0
    done = (k == 0) | (k == n)
    for h in range(depth, 0, -1):
        half = 1 << (h - 1)
        m = (k // (2 * half)) * (2 * half) + half
        act = ~done & (m < n)
        if not act.any():
            continue
        row = (ra + rb) / 2.0
        row[:, h] += 0.5
        hit = act & (k == m)
        left = act & (k < m)
        right = act & (k > m)
        rows[hit] = row[hit]
        rb[left] = row[left]
        ra[right] = row[right]
        done |= hit
    return rows


def haar_range_variance(n: int, lo: npt.ArrayLike, hi: npt.ArrayLike, variance: float) -> FloatArray:
    """Noise variance of the linear Haar estimate of the counts of bins [lo, hi), each coefficient with `variance`.

    Equal to variance * ||haar_prefix_adjoint(g)||^2 for g the range's weights on prefix sums,
    in O(log n) per range (vectorised over the ranges) instead of O(n): the estimate is
    pp[hi] - pp[lo], and each pp[k] involves one coefficient per height (`_haar_prefix_rows`).
    """
    lo_a = np.atleast_1d(np.asarray(lo, dtype=np.int64))
    hi_a = np.atleast_1d(np.asarray(hi, dtype=np.int64))
    if lo_a.shape != hi_a.shape or np.any(lo_a < 0) or np.any(lo_a >= hi_a) or np.any(hi_a > n):
        raise InvalidInputError(f"ranges must satisfy 0 <= lo < hi <= {n}")
    r_hi = _haar_prefix_rows(n, hi_a)
    r_lo = _haar_prefix_rows(n, lo_a)
    depth = haar_depth(n)
    # Column h holds the node of height h on each end's path: the same node for both ends iff they fall in
    # the same block of 2^h bins (a zero entry contributes nothing either way). The total is shared.
    block = np.left_shift(1, np.arange(depth + 1, dtype=np.int64))
    shared = (lo_a[:, None] // block[None, :]) == (hi_a[:, None] // block[None, :])
    shared[:, 0] = True
    diff2 = np.where(shared, (r_hi - r_lo) ** 2, r_hi**2 + r_lo**2)
    return np.asarray(variance * diff2.sum(axis=1), dtype=np.float64)

def haar_nonnegative_prefix(w: npt.ArrayLike) -> FloatArray:
    """Inverse Haar with the non-negative refinement of Terada et al. / Hongo et al.

    Top-down: the total is clamped at 0; at each node with (already non-negative) sum S and
    noisy detail d, the children's sums are (S + d)/2 and (S - d)/2 (from S_l + S_r = S,
    S_l - S_r = d). When a child would be negative, the detail is shrunk by
    beta = S / |d| so that the smaller child is exactly 0, as in the seed paper's
    refinement (its 2-D rule scales the three details of a 2x2 block the same way). This is a
    non-linear post-processing: unbiasedness and the linear standard errors no longer hold
    exactly; it removes negative counts and sharply reduces error on sparse data.
    """
    c = np.asarray(w, dtype=np.float64)
    n = c.size
    pp = np.zeros(n + 1)
    pp[n] = max(c[n - 1], 0.0)
    for _, a, m, b in _haar_nodes(n):
        s = pp[b] - pp[a]
        d = c[m - 1]
        # Children: left = (s + d)/2, right = (s - d)/2. Shrink d so both are >= 0.
        d = np.clip(d, -s, s)
        pp[m] = pp[a] + (s + d) / 2.0
    return pp[1:]
