"""Clark et al. 2019's head map: every head of a site placed in 2-D by multidimensional scaling
of the Jensen–Shannon distances between heads (metrics.head_distances), and the numbers behind
the claim that heads of deeper layers differ less from one another (diversity per layer)."""

from __future__ import annotations

import numpy as np

from heads_lab.errors import ConfigError


def mds_coordinates(distances: np.ndarray, seed: int = 0) -> np.ndarray:
    """[heads, 2]: metric MDS of a symmetric distance matrix (scikit-learn's SMACOF, started
    from classical MDS, so the same matrix gives the same map). Clark et al. use sklearn's MDS
    on their distance matrix too."""
    try:
        from sklearn.manifold import MDS  # lazy: start-up time (scikit-learn), optional on old installs
    except ImportError:  # a dependency since the head map; an older install may lack it
        raise ConfigError("the head map needs scikit-learn: pip install 'scikit-learn>=1.8' "
                          "(or `make install`)") from None
    d = np.asarray(distances, dtype=float)
    if d.ndim != 2 or d.shape[0] != d.shape[1]:
        raise ValueError(f"mds_coordinates: distances of shape {d.shape}; expected square")
    if d.shape[0] < 3:  # SMACOF needs a few points; two heads lie on a line
        out = np.zeros((d.shape[0], 2))
        if d.shape[0] == 2:
            out[1, 0] = d[0, 1]
        return out
    d = 0.5 * (d + d.T)
    np.fill_diagonal(d, 0.0)
    mds = MDS(n_components=2, metric="precomputed", init="classical_mds", random_state=seed)
    if _classical_is_defined(d):
        return mds.fit_transform(d)
    # a matrix far from Euclidean (a barely trained model's heads) can have fewer than two
    # positive eigenvalues: scikit-learn's classical start takes the root of a negative one
    # (NaN) and SMACOF fails; start it from the classical solution with those clipped to 0
    return mds.fit_transform(d, init=_classical(d))


def _double_centred(d: np.ndarray) -> np.ndarray:
    n = d.shape[0]
    centre = np.eye(n) - np.full((n, n), 1.0 / n)
    return -0.5 * centre @ (d ** 2) @ centre


def _classical_is_defined(d: np.ndarray) -> bool:
    """Whether classical MDS in 2-D takes roots of clearly positive eigenvalues only (one that
    is 0 up to rounding may come out negative in scikit-learn's own computation)."""
    eigenvalues = np.linalg.eigvalsh(_double_centred(d))
    return bool(eigenvalues[-2] > 1e-9 * max(eigenvalues[-1], 0.0))


def _classical(d: np.ndarray) -> np.ndarray:
    """Classical MDS (Torgerson) in 2-D, negative eigenvalues clipped to 0: [heads, 2]."""
    eigenvalues, vectors = np.linalg.eigh(_double_centred(d))
    top = np.argsort(eigenvalues)[::-1][:2]
    return vectors[:, top] * np.sqrt(np.clip(eigenvalues[top], 0.0, None))


def within_layer(distances: np.ndarray, layers: int) -> list[dict[str, float]]:
    """Per layer, the mean and standard deviation of the distances between its own heads, and
    the mean distance from its heads to the other layers' heads."""
    d = np.asarray(distances, dtype=float)
    heads = d.shape[0] // max(layers, 1)
    out = []
    for layer in range(layers):
        block = slice(layer * heads, (layer + 1) * heads)
        inner = d[block, block][np.triu_indices(heads, 1)] if heads > 1 else np.zeros(1)
        rest = np.delete(d[block], np.s_[layer * heads:(layer + 1) * heads], axis=1)
        out.append({"mean": float(inner.mean()), "std": float(inner.std()),
                    "to_other_layers": float(rest.mean()) if rest.size else float("nan")})
    return out
