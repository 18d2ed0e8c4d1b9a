"""Noisy linear imputation of ROAD, batched and on the input's device.

ROAD (Rong, Leemann, Borisov, Kasneci and Kasneci, "A Consistent and Efficient Evaluation
Strategy for Attribution Methods", ICML 2022) fills each removed pixel with the weighted mean of
its eight neighbours (1/6 for the four direct ones, 1/12 for the four diagonal ones, normalised
over the neighbours inside the image), neighbours that are removed too being unknowns of the same
sparse linear system, one system per image with the channels as right-hand sides; Gaussian noise
is then added to the imputed pixels. The paper's reference (``NoisyLinearImputer``, which Quantus
copies as ``noisy_linear_imputation``) solves the system with ``scipy.sparse.linalg.spsolve``,
one image at a time, on the CPU.

Here the whole batch is solved with torch operations on the input's device: conjugate gradients
preconditioned by a geometric multigrid V-cycle, started from a full multigrid guess. The coarse
levels are Galerkin products R A P of bilinear interpolation P, built with one strided
convolution each, so that holes of any shape, isolated known pixels and the free image border all
coarsen exactly; the smoother is Jacobi, whose smoothing factor on this 9-point stencil is 1/3.
Each iteration divides the error by about 15, whatever the holes: five to seven iterations reach
the exact solution to about 1e-6 in float32. Two things keep float32 that accurate: the solve is
relative to the mean of the known pixels (with few known pixels the solution is nearly constant,
the system nearly singular), and the residual it starts from is formed from differences of
neighbours, which do not cancel. Memory traffic bounds the speed on a CPU: the finest level works
in place, in preallocated buffers.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["noisy_linear_impute"]

_OFFSETS = [(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1)]  # stencil slot k = 3 (dy + 1) + dx + 1
_COARSEST = 8  # a level with no side longer than this is solved directly


def noisy_linear_impute(
    images: Tensor,
    removed: Tensor,
    *,
    noise: float = 0.01,
    generator: torch.Generator | None = None,
    tol: float = 1e-5,
    max_iter: int = 50,
) -> Tensor:
    """Fill removed pixels by ROAD's noisy linear imputation.

    Every removed pixel becomes the weighted mean of its 8 neighbours inside the image (weight
    1/6 for the 4 direct neighbours, 1/12 for the 4 diagonal ones, normalised over the
    neighbours that exist), removed neighbours being unknowns of the same linear system, solved
    for each channel; then Gaussian noise of standard deviation ``noise`` is added to the removed
    pixels only. This is the ``NoisyLinearImputer`` of Rong et al., "A Consistent and Efficient
    Evaluation Strategy for Attribution Methods", ICML 2022 (Quantus's
    ``noisy_linear_imputation``), computed for a whole batch on the input's device.

    Parameters
    ----------
    images : Tensor
        ``(N, C, H, W)`` floating point images, in whatever space the model reads them. The
        imputation is linear, so only the noise depends on that space.
    removed : Tensor
        ``(N, H, W)`` boolean mask, True where a pixel (all its channels) is removed.
    noise : float
        Standard deviation of the Gaussian noise added to the imputed pixels; 0 for none. The
        reference adds 0.01 to images in [0, 1], before normalisation: for inputs normalised by
        ``std``, ``0.01 / std`` reproduces it.
    generator : torch.Generator, optional
        Source of the noise, on the images' device; the global generator when None.
    tol : float
        The solver stops once no imputed value moved by more than ``tol`` in an iteration; the
        error left is then about ten times smaller.
    max_iter : int
        Bound on the number of iterations.

    Returns
    -------
    Tensor
        A new tensor of the images' shape, dtype and device: known pixels unchanged, removed ones
        imputed, plus noise. An image with every pixel removed has nothing to impute from (its
        system is singular): its pixels become 0, the mean of normalised inputs, plus noise.
        Computed in float32 (float64 for float64 images), without autograd.

    Examples
    --------
    >>> import torch
    >>> images = torch.tensor([[[[1.0, 2.0, 3.0], [4.0, 0.0, 6.0], [7.0, 8.0, 9.0]]]])
    >>> removed = torch.zeros(1, 3, 3, dtype=torch.bool)
    >>> removed[0, 1, 1] = True
    >>> noisy_linear_impute(images, removed, noise=0.0)[0, 0]
    tensor([[1., 2., 3.],
            [4., 5., 6.],
            [7., 8., 9.]])
    """
    _check_impute_arguments(images, removed, noise)
    return _impute(images, removed.to(images.device), noise, generator, tol, max_iter)


def _check_impute_arguments(images: Tensor, removed: Tensor, noise: float) -> None:
    """Raise ValueError unless images are (N, C, H, W) floats, removed an (N, H, W) boolean
    mask and noise a standard deviation."""
    if images.dim() != 4 or not images.is_floating_point():
        raise ValueError(
            f"images must be a floating point (N, C, H, W) tensor, got {tuple(images.shape)} {images.dtype}"
        )
    n, _, h, w = images.shape
    if removed.dtype != torch.bool or tuple(removed.shape) != (n, h, w):
        raise ValueError(
            f"removed must be a boolean (N, H, W) = {(n, h, w)} tensor, got {tuple(removed.shape)} {removed.dtype}"
        )
    if not noise >= 0:
        raise ValueError(f"noise must be a standard deviation >= 0, got {noise}")


def _impute(
    images: Tensor, removed: Tensor, noise: float, generator: torch.Generator | None, tol: float, max_iter: int
) -> Tensor:
    """:func:`noisy_linear_impute` on checked arguments, ``removed`` on the images' device."""
    with torch.no_grad():
        images = images.detach()
        counts = removed.flatten(1).sum(1)
        if not bool(counts.any()):
            return images.clone()
        work = torch.float64 if images.dtype == torch.float64 else torch.float32
        out = _impute_without_noise(images, removed, counts, work, tol, max_iter)
        if noise > 0:
            draws = torch.randn(out.shape, generator=generator, device=out.device, dtype=work)
            out.add_(draws.mul_(noise).masked_fill_(~removed[:, None], 0))
    return out.to(images.dtype)


def _impute_without_noise(
    images: Tensor, removed: Tensor, counts: Tensor, work: torch.dtype, tol: float, max_iter: int
) -> Tensor:
    """A new ``work``-typed copy of the images with the removed pixels imputed; an image with
    ``counts`` (removed pixels) of every pixel becomes 0, one with none stays as it is."""
    h, w = images.shape[-2:]
    solvable = (counts > 0) & (counts < h * w)
    if bool(solvable.all()):  # _solve returns a new tensor and leaves its input alone
        return _solve(images.to(work).contiguous(), removed[:, None].to(work), tol, max_iter)
    out = images.to(work, memory_format=torch.contiguous_format, copy=True)
    some = solvable.nonzero().flatten()
    if len(some):
        out[some] = _solve(out[some], removed[some, None].to(work), tol, max_iter)
    out[counts == h * w] = 0
    return out


# --- The system ---------------------------------------------------------------------------------
#
# With u = 1 on removed pixels (0 on known ones), s_i the sum of the weights of pixel i's in-image
# neighbours and x the removed values (0 on known pixels), the equations are, for each removed i,
#     s_i x_i - sum_{removed j} w_ij x_j = sum_{known k} w_ik y_k,
# a symmetric system A x = b, positive definite as soon as one pixel of the image is known. The
# weighted sum of the 8 neighbours is (sep(y) - 4 y) / 12, sep being the [1, 2, 1] x [1, 2, 1]
# filter, zero outside the image; so A x = u (s + 1/3) x - (u / 12) sep(x) for x zero on known
# pixels.
#
# The finest level works in preallocated buffers with in-place operations: at 224 x 224 it is
# bound by memory traffic, and fresh tensors of that size also cost page faults on the CPU.


def _sep(x: Tensor, out: Tensor | None = None, rows: Tensor | None = None, cols: Tensor | None = None) -> Tensor:
    """The [1, 2, 1] x [1, 2, 1] filter of (..., H, W), zero outside, as sums of adjacent pairs."""
    *batch, h, w = x.shape
    rows = x.new_empty(*batch, h + 1, w) if rows is None else rows
    cols = x.new_empty(*batch, h, w + 1) if cols is None else cols
    out = torch.empty_like(x) if out is None else out
    torch.add(x[..., :-1, :], x[..., 1:, :], out=rows[..., 1:-1, :])
    rows[..., 0, :] = x[..., 0, :]
    rows[..., -1, :] = x[..., -1, :]
    torch.add(rows[..., :-1, :], rows[..., 1:, :], out=out)
    torch.add(out[..., :-1], out[..., 1:], out=cols[..., 1:-1])
    cols[..., 0] = out[..., 0]
    cols[..., -1] = out[..., -1]
    return torch.add(cols[..., :-1], cols[..., 1:], out=out)


def _prolong(xc: Tensor, hf: int, wf: int, out: Tensor | None = None) -> Tensor:
    """Bilinear interpolation from coarse node I (on fine pixel 2I) to the (hf, wf) grid."""
    *batch, _, wc = xc.shape
    half = xc.new_empty(*batch, hf, wc)
    half[..., 0::2, :] = xc[..., : (hf + 1) // 2, :]
    torch.lerp(xc[..., : hf // 2, :], xc[..., 1 : hf // 2 + 1, :], 0.5, out=half[..., 1::2, :])
    out = xc.new_empty(*batch, hf, wf) if out is None else out
    out[..., 0::2] = half[..., : (wf + 1) // 2]
    torch.lerp(half[..., : wf // 2], half[..., 1 : wf // 2 + 1], 0.5, out=out[..., 1::2])
    return out


def _restrict(x: Tensor) -> Tensor:
    """The transpose of _prolong: out[I] = x[2I] + (x[2I - 1] + x[2I + 1]) / 2 in each direction."""
    *batch, h, w = x.shape
    hc, wc = h // 2 + 1, w // 2 + 1
    half = x.new_zeros(*batch, hc, w)
    half[..., : (h + 1) // 2, :] = x[..., 0::2, :]
    odd = x[..., 1::2, :]
    half[..., : h // 2, :].add_(odd, alpha=0.5)
    half[..., 1 : h // 2 + 1, :].add_(odd, alpha=0.5)
    out = x.new_zeros(*batch, hc, wc)
    out[..., : (w + 1) // 2] = half[..., 0::2]
    odd = half[..., 1::2]
    out[..., : w // 2].add_(odd, alpha=0.5)
    out[..., 1 : w // 2 + 1].add_(odd, alpha=0.5)
    return out


def _dot(a: Tensor, b: Tensor, scratch: Tensor) -> Tensor:
    """Per-plane inner products, (B, C, 1, 1)."""
    return torch.mul(a, b, out=scratch).sum((-2, -1), keepdim=True)


def _exact_residual(z: Tensor, u: Tensor, out: Tensor, scratch: Tensor) -> Tensor:
    """out = b - A x for the whole image z = known + x, as sum_j w_ij (z_j - z_i) over the in-image
    neighbours j of each removed pixel i: from differences, it does not cancel like c1 x - c2 sep(x)."""
    h, w = z.shape[-2:]
    out.zero_()
    for dy, dx, weight in ((0, 1, 1 / 6), (1, 0, 1 / 6), (1, 1, 1 / 12), (1, -1, 1 / 12)):
        lo = (..., slice(0, h - dy), slice(max(-dx, 0), w - max(dx, 0)))
        hi = (..., slice(dy, h), slice(max(dx, 0), w - max(-dx, 0)))
        d = torch.sub(z[hi], z[lo], out=scratch[..., : h - dy, : w - abs(dx)])
        out[lo].add_(d, alpha=weight)
        out[hi].sub_(d, alpha=weight)
    return out.mul_(u)


class _Fine:
    """The finest level, with buffers for C channels."""

    def __init__(self, u: Tensor, channels: int):
        s = (_sep(torch.ones_like(u[:1])) - 4) / 12
        self.u, self.shape = u, (u.shape[-2], u.shape[-1])
        self.s = s
        self.c1 = u * (s + 1 / 3)
        self.c2 = u / 12
        self.nc2 = -self.c2
        self.invd = u / s
        self.g = 1 - self.c1 * self.invd  # b - A (invd b) = g b + c2 sep(invd b)
        b, _, h, w = u.shape
        self.rows = u.new_empty(b, channels, h + 1, w)
        self.cols = u.new_empty(b, channels, h, w + 1)
        self.tmp = u.new_empty(b, channels, h, w)

    def stencil(self) -> Tensor:
        """(B, 9, H + 3, W + 3): entries a_o(i) = A[i, i + o] at [..., 1 + i], zero around."""
        b, _, h, w = self.u.shape
        a = self.u.new_zeros(b, 9, h + 3, w + 3)  # one more row and column for _coarsen
        p = F.pad(self.u, (1, 1, 1, 1))
        for k, (dy, dx) in enumerate(_OFFSETS):
            if dy == dx == 0:
                torch.mul(self.u, self.s, out=a[:, 4:5, 1 : h + 1, 1 : w + 1])
            else:
                weight = -1 / 6 if dy == 0 or dx == 0 else -1 / 12
                shifted = p[..., 1 + dy : 1 + dy + h, 1 + dx : 1 + dx + w]
                torch.mul(self.u, shifted, out=a[:, k : k + 1, 1 : h + 1, 1 : w + 1]).mul_(weight)
        return a

    def apply(self, x: Tensor, out: Tensor) -> Tensor:
        """out = A x."""
        _sep(x, out, self.rows, self.cols).mul_(self.nc2)
        return out.addcmul_(self.c1, x)

    def residual(self, b: Tensor, x: Tensor, out: Tensor) -> Tensor:
        """out = b - A x."""
        _sep(x, out, self.rows, self.cols).mul_(self.c2).add_(b)
        return out.addcmul_(self.c1, x, value=-1)

    def vcycle(self, levels: list, dense: _Dense, b: Tensor, x: Tensor, zero: bool) -> Tensor:
        """One V(1,1)-cycle with Jacobi smoothing on A x = b, in place on x (taken as 0 if zero)."""
        t = self.tmp
        if zero:
            torch.mul(self.invd, b, out=x)
            _sep(x, t, self.rows, self.cols).mul_(self.c2).addcmul_(self.g, b)  # b - A x
        else:
            x.addcmul_(self.invd, self.residual(b, x, t))
            self.residual(b, x, t)
        coarse = levels[1] if len(levels) > 1 else dense
        ec = _vcycle(levels, dense, 1, coarse.u * _restrict(t))
        x.addcmul_(self.u, _prolong(ec, *self.shape, out=t))
        return x.addcmul_(self.invd, self.residual(b, x, t))


class _Coarse:
    """A coarse level: a 9-point stencil a (B, 9, h, w), inside a zero frame; u = 1 on active nodes."""

    def __init__(self, padded: Tensor, u: Tensor):
        self.u, self.shape = u, (u.shape[-2], u.shape[-1])
        h, w = self.shape
        self.padded = padded
        self.a = a = padded[..., 1 : h + 1, 1 : w + 1]
        diag = a[:, 4:5]
        self.invd = torch.where(diag > 0, 1 / diag.masked_fill(diag <= 0, 1), torch.zeros_like(diag))

    def residual(self, b: Tensor, x: Tensor) -> Tensor:
        h, w = self.shape
        p = F.pad(x, (1, 1, 1, 1))
        r = torch.addcmul(b, self.a[:, 4:5], x, value=-1)
        for k, (dy, dx) in enumerate(_OFFSETS):
            if k != 4:
                r.addcmul_(self.a[:, k : k + 1], p[..., 1 + dy : 1 + dy + h, 1 + dx : 1 + dx + w], value=-1)
        return r


@functools.cache
def _galerkin_weights() -> tuple:
    """K[D][o][e]: the weight of fine entry a_o(2I + e) in coarse entry A_c(I, I + D), for bilinear P.

    Only for the centre and the four forward offsets D (slots 4 to 8): A_c is symmetric.
    """
    b = {-1: 0.5, 0: 1.0, 1: 0.5}
    k = [[[[0.0] * 3 for _ in range(3)] for _ in range(9)] for _ in range(5)]
    for d, (dy, dx) in enumerate(_OFFSETS[4:]):
        for o, (oy, ox) in enumerate(_OFFSETS):
            for ey in (-1, 0, 1):
                for ex in (-1, 0, 1):
                    ty, tx = ey + oy - 2 * dy, ex + ox - 2 * dx
                    if abs(ty) <= 1 and abs(tx) <= 1:
                        k[d][o][ey + 1][ex + 1] = b[ey] * b[ex] * b[ty] * b[tx]
    return tuple(tuple(tuple(tuple(row) for row in e) for e in o) for o in k)


def _coarsen(u: Tensor, stencil: Tensor) -> _Coarse:
    """The Galerkin level R A P below a level of activity u, P bilinear and masked.

    ``stencil`` holds the level's entries a_o(i) at [..., 1 + i] of a (B, 9, h + 3, w + 3) zero
    padded tensor. Coarse node I sits on fine point 2I and is active iff fine point min(2I, last)
    is: with an even side the last coarse row or column lies just outside the grid and takes the
    activity of the edge beside it, so that P still reproduces constants there and the image
    border stays a free boundary on every level. P, restricted to active nodes, has full column
    rank, so A_c is positive definite like A.
    """
    hf, wf = u.shape[-2:]
    hc, wc = hf // 2 + 1, wf // 2 + 1
    uc = F.pad(u, (0, 1 - wf % 2, 0, 1 - hf % 2), mode="replicate")[..., ::2, ::2]
    weights = torch.tensor(_galerkin_weights(), dtype=stencil.dtype, device=stencil.device)
    forward = F.conv2d(stencil[..., : 2 * hc + 1, : 2 * wc + 1], weights, stride=2)
    up = F.pad(uc, (1, 1, 1, 1))
    both = torch.cat([up[..., 1 + dy : 1 + dy + hc, 1 + dx : 1 + dx + wc] for dy, dx in _OFFSETS[4:]], 1)
    a = u.new_zeros(u.shape[0], 9, hc + 3, wc + 3)  # padded like the fine stencil, for the next level
    inner = a[..., 1 : hc + 1, 1 : wc + 1]
    torch.mul(forward, both, out=inner[:, 4:]).mul_(uc)
    for k in range(4):  # A_c(I, I - D) = A_c(I - D, I)
        dy, dx = _OFFSETS[8 - k]
        inner[:, k, max(dy, 0) :, max(dx, 0) : wc + min(dx, 0)] = inner[
            :, 8 - k, : hc - dy, max(-dx, 0) : wc - max(dx, 0)
        ]
    return _Coarse(a, uc)


class _Dense:
    """The coarsest level, by an explicit inverse of its (small, SPD) matrix."""

    def __init__(self, u: Tensor, stencil: Tensor):
        b, _, h, w = u.shape
        n = h * w
        yy, xx = torch.meshgrid(torch.arange(h, device=u.device), torch.arange(w, device=u.device), indexing="ij")
        m = torch.zeros(b, n * n, device=u.device, dtype=u.dtype)
        for k, (dy, dx) in enumerate(_OFFSETS):
            y2, x2 = yy + dy, xx + dx
            ok = (y2 >= 0) & (y2 < h) & (x2 >= 0) & (x2 < w)
            m[:, ((yy * w + xx) * n + y2 * w + x2)[ok]] = stencil[:, k][:, ok]
        m = m.view(b, n, n) + torch.diag_embed((u.reshape(b, n) == 0).to(u.dtype))
        # Cholesky, not LU: batched LU from MKL returned corrupt pivots on two threads here
        self.inv = torch.cholesky_inverse(torch.linalg.cholesky_ex(m)[0])
        self.u, self.shape = u, (h, w)

    def solve(self, rhs: Tensor) -> Tensor:
        b, c, h, w = rhs.shape
        x = self.inv @ rhs.reshape(b, c, h * w).transpose(1, 2)
        return x.transpose(1, 2).reshape(b, c, h, w) * self.u


def _hierarchy(u: Tensor, channels: int) -> tuple[list, _Dense]:
    """The levels [fine, coarse...] above the coarsest, and the coarsest; fine may be the coarsest."""
    fine = _Fine(u, channels)
    levels: list = [fine]
    stencil = fine.stencil()
    while max(levels[-1].shape) > _COARSEST:
        levels.append(_coarsen(levels[-1].u, stencil))
        stencil = levels[-1].padded
    h, w = levels[-1].shape
    dense = _Dense(levels[-1].u, stencil[..., 1 : h + 1, 1 : w + 1])
    return levels[:-1] or levels, dense


def _vcycle(levels: list, dense: _Dense, depth: int, b: Tensor, x: Tensor | None = None) -> Tensor:
    """One V(1,1)-cycle with Jacobi smoothing on coarse level ``depth`` (>= 1) from x (0 if None)."""
    if depth >= len(levels):
        return dense.solve(b)
    level = levels[depth]
    x = level.invd * b if x is None else torch.addcmul(x, level.invd, level.residual(b, x))
    coarse = levels[depth + 1] if depth + 1 < len(levels) else dense
    ec = _vcycle(levels, dense, depth + 1, coarse.u * _restrict(level.residual(b, x)))
    x = torch.addcmul(x, level.u, _prolong(ec, *level.shape))
    return torch.addcmul(x, level.invd, level.residual(b, x))


def _solve(images: Tensor, u: Tensor, tol: float, max_iter: int) -> Tensor:
    """The removed (u = 1) pixels of images (B, C, H, W) imputed, without noise; each image has a known pixel."""
    # relative to the mean of the known pixels, which is where a hole far from them tends to: the
    # smooth, nearly singular part of the solution is then small, and so is its float32 rounding
    keep = 1 - u
    mean = (images * keep).sum((-2, -1), keepdim=True) / keep.sum((-2, -1), keepdim=True)
    known = (images - mean).mul_(keep)
    levels, dense = _hierarchy(u, images.shape[1])
    fine = levels[0]
    b = _sep(known, rows=fine.rows, cols=fine.cols).mul_(fine.c2)  # the known neighbours' weighted sum
    if max(fine.shape) <= _COARSEST:  # the finest level is the coarsest
        return torch.where(u > 0, dense.solve(b).add_(mean), images)
    # full multigrid guess: solve on the coarsest level, then one V-cycle on each finer level
    rhs = [b]
    for level in [*levels[1:], dense]:
        rhs.append(level.u * _restrict(rhs[-1]))
    x = dense.solve(rhs[-1])
    for depth in range(len(levels) - 1, 0, -1):
        x = _vcycle(levels, dense, depth, rhs[depth], levels[depth].u * _prolong(x, *levels[depth].shape))
    x = fine.vcycle(levels, dense, b, _prolong(x, *fine.shape).mul_(fine.u), zero=False)
    # conjugate gradients preconditioned by the V-cycle, per image and channel, from a residual
    # computed exactly: the float32 recurrence then stays accurate to about 1e-6
    z, q, scratch = torch.empty_like(x), torch.empty_like(x), b  # b is not needed any more
    r = _exact_residual(torch.add(known, x, out=q), u, torch.empty_like(x), z)
    p = fine.vcycle(levels, dense, r, torch.empty_like(r), zero=True)
    rz = _dot(r, p, scratch)
    for _ in range(max_iter):
        fine.apply(p, q)
        pq = _dot(p, q, scratch)
        alpha = torch.where(pq > 0, rz / pq.masked_fill(pq <= 0, 1), torch.zeros_like(pq))
        x.addcmul_(alpha, p)
        moved = alpha.abs() * torch.maximum(p.amax((-2, -1), keepdim=True), -p.amin((-2, -1), keepdim=True))
        done = moved <= tol
        if bool(done.all()):
            break
        r.addcmul_(alpha, q, value=-1)
        if bool(done.any()):  # converged planes get exact zeros, not ever smaller (denormal, slow) numbers
            r.mul_(~done)
        fine.vcycle(levels, dense, r, z, zero=True)
        rz_new = _dot(r, z, scratch)
        beta = torch.where(rz > 0, rz_new / rz.masked_fill(rz <= 0, 1), torch.zeros_like(rz))
        rz = rz_new
        torch.addcmul(z, beta, p, out=p)
    return torch.where(u > 0, x.add_(mean), images)
