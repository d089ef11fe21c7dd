#!/usr/bin/env python3
"""Golden values for the HLA operators, computed in float64 from the definitions.

The expected outputs come from explicit sums over index tuples (the definitions in
docs/math.md §2.2, §3, §6, §7, §8), not from any of the fast forms the Rust code
implements. The script also checks, in float64, the forms this project derives beyond
the paper (see check_derived): the gated third-order kernel, the gated AHLA chunk step and
the chunk step written with per-token inclusive quantities A (rows S_u q_u) and B (rows
q_uᵀ P_u) that the Rust chunked forms use.

Run:  python3 generate.py > golden.json        (needs numpy)
"""
import json
import sys

import numpy as np

B, H, T, D, DV = 2, 2, 7, 3, 2
EPS = 1e-3


def w(lg, t, x):
    """w(t, x) = prod_{s=x+1..t} g_s."""
    return np.exp(np.sum(lg[x + 1:t + 1]))


def linear_def(q, k, v, lg):
    n = len(q)
    o = np.zeros((n, v.shape[1]))
    for t in range(n):
        for j in range(t + 1):
            o[t] += w(lg, t, j) * (q[t] @ k[j]) * v[j]
    return o


def hla2_def(q, k, v, lg):
    n = len(q)
    o = np.zeros((n, v.shape[1]))
    for t in range(n):
        for j in range(t + 1):
            for i in range(j + 1):
                o[t] += w(lg, t, i) * w(lg, t, j) * (q[t] @ k[i]) * (q[j] @ k[i]) * v[j]
    return o


def hla3_def(q, k, v, lg):
    n = len(q)
    o = np.zeros((n, v.shape[1]))
    for t in range(n):
        for u in range(t + 1):
            for i in range(u + 1):
                for j in range(u + 1):
                    wt = w(lg, t, i) * w(lg, t, u) * w(lg, t, j)
                    o[t] += wt * (q[t] @ k[i]) * (q[u] @ k[i]) * (q[u] @ k[j]) * v[j]
    return o


def ahla_def(q, k, v, lg):
    n = len(q)
    o = np.zeros((n, v.shape[1]))
    for t in range(n):
        for j in range(t + 1):
            for i in range(j, t + 1):
                o[t] += w(lg, t, j) * (q[t] @ k[i]) * (q[i] @ k[j]) * v[j]
    return o


def normalized(defn, q, k, v, lg):
    num = defn(q, k, v, lg)
    den = defn(q, k, np.ones((len(q), 1)), lg)[:, 0]
    den = np.where(den < 0, -np.maximum(-den, EPS), np.maximum(den, EPS))
    return num / den[:, None]


# ---- checks of the forms derived in this project (float64) -----------------------

def serial2(q, k, v, lg):
    d = q.shape[1]
    S = np.zeros((d, d)); Z = np.zeros((d, v.shape[1])); o = []
    for t in range(len(q)):
        g = np.exp(lg[t])
        S = g * S + np.outer(k[t], k[t])
        Z = g * g * Z + np.outer(S @ q[t], v[t])
        o.append(q[t] @ Z)
    return np.array(o)


def serial3(q, k, v, lg):
    d = q.shape[1]
    S = np.zeros((d, d)); P = np.zeros((d, v.shape[1])); Y = np.zeros_like(P); o = []
    for t in range(len(q)):
        g = np.exp(lg[t])
        S = g * S + np.outer(k[t], k[t])
        P = g * P + np.outer(k[t], v[t])
        Y = g ** 3 * Y + np.outer(S @ q[t], q[t] @ P)
        o.append(q[t] @ Y)
    return np.array(o)


def serial_ahla(q, k, v, lg):
    d = q.shape[1]
    P = np.zeros((d, v.shape[1])); E = np.zeros_like(P); o = []
    for t in range(len(q)):
        g = np.exp(lg[t])
        P = g * P + np.outer(k[t], v[t])
        E = g * E + np.outer(k[t], q[t] @ P)
        o.append(q[t] @ E)
    return np.array(o)


def chunked(kind, q, k, v, lg, c):
    """Chunk step with inclusive per-token rows A_u = S_u q_u and B_u = P_uᵀ q_u."""
    d, dv = q.shape[1], v.shape[1]
    S = np.zeros((d, d)); P = np.zeros((d, dv)); Z = np.zeros((d, dv)); o = []
    for s in range(0, len(q), c):
        qc, kc, vc = q[s:s + c], k[s:s + c], v[s:s + c]
        b = np.cumsum(lg[s:s + c]); a = np.exp(b); e = np.exp(b[-1] - b); rho = a[-1]
        n = len(qc)
        low = np.tril(np.ones((n, n)))
        diff = np.where(low > 0, b[:, None] - b[None, :], -np.inf)
        Dp = lambda p: np.exp(p * diff)
        Wg = Dp(1) * (qc @ kc.T)
        if kind == 'ahla':
            Bm = a[:, None] * (qc @ P) + Wg @ vc
            o.append(a[:, None] * (qc @ Z) + Wg @ Bm)
            Z = rho * Z + kc.T @ (e[:, None] * Bm)
            P = rho * P + kc.T @ (e[:, None] * vc)
            continue
        A = a[:, None] * (qc @ S) + Wg @ kc
        if kind == 'hla2':
            o.append((a ** 2)[:, None] * (qc @ Z) + ((qc @ A.T) * Dp(2)) @ vc)
            Z = rho ** 2 * Z + A.T @ ((e ** 2)[:, None] * vc)
        else:
            Bm = a[:, None] * (qc @ P) + Wg @ vc
            o.append((a ** 3)[:, None] * (qc @ Z) + ((qc @ A.T) * Dp(3)) @ Bm)
            Z = rho ** 3 * Z + A.T @ ((e ** 3)[:, None] * Bm)
            P = rho * P + kc.T @ (e[:, None] * vc)
        S = rho * S + kc.T @ (e[:, None] * kc)
    return np.concatenate(o)


def check_derived(rng):
    n, d, dv = 11, 4, 3
    q, k, v = rng.normal(size=(n, d)) * 0.6, rng.normal(size=(n, d)) * 0.6, rng.normal(size=(n, dv))
    worst = 0.0
    for lg in (np.zeros(n), np.log(rng.uniform(0.5, 1.0, size=n))):
        for kind, defn, serial in (('hla2', hla2_def, serial2), ('hla3', hla3_def, serial3),
                                   ('ahla', ahla_def, serial_ahla)):
            ref = defn(q, k, v, lg)
            for got in [serial(q, k, v, lg)] + [chunked(kind, q, k, v, lg, c) for c in (1, 3, 4, 11)]:
                err = np.max(np.abs(got - ref)) / np.max(np.abs(ref))
                assert err < 1e-12, (kind, err)
                worst = max(worst, err)
    # the matrix definitions used by the Rust reference forms
    L = np.tril(np.ones((n, n)))
    W = L * (q @ k.T)
    assert np.allclose(((W @ W.T) * L) @ v, hla2_def(q, k, v, np.zeros(n)), rtol=0, atol=1e-12)
    assert np.allclose((((W @ W.T) * L) @ W) @ v, hla3_def(q, k, v, np.zeros(n)), rtol=0, atol=1e-12)
    assert np.allclose(((W @ W) * L) @ v, ahla_def(q, k, v, np.zeros(n)), rtol=0, atol=1e-12)
    return worst


def main():
    rng = np.random.default_rng(20251031)
    worst = check_derived(rng)
    print(f"derived forms agree with the definitions: max rel err {worst:.1e}", file=sys.stderr)
    q = np.round(rng.normal(size=(B, H, T, D)) * 0.7, 4)
    k = np.round(rng.normal(size=(B, H, T, D)) * 0.7, 4)
    v = np.round(rng.normal(size=(B, H, T, DV)), 4)
    log_g = np.round(np.log(rng.uniform(0.6, 1.0, size=(B, H, T))), 4)
    zero = np.zeros(T)
    cases = {}
    for name, defn in (('linear', linear_def), ('hla2', hla2_def), ('hla3', hla3_def), ('ahla', ahla_def)):
        for gated in (False, True):
            for norm in (False, True):
                out = np.zeros((B, H, T, DV))
                for b in range(B):
                    for h in range(H):
                        lg = log_g[b, h] if gated else zero
                        args = (q[b, h], k[b, h], v[b, h], lg)
                        out[b, h] = normalized(defn, *args) if norm else defn(*args)
                key = name + ('_gated' if gated else '') + ('_normalized' if norm else '')
                cases[key] = out.reshape(-1).tolist()
    fixture = {
        'generator': 'model/tests/golden/generate.py',
        'shape': {'batch': B, 'heads': H, 'time': T, 'd': D, 'dv': DV},
        'normalize_eps': EPS,
        'q': q.reshape(-1).tolist(), 'k': k.reshape(-1).tolist(), 'v': v.reshape(-1).tolist(),
        'log_g': log_g.reshape(-1).tolist(),
        'expected': cases,
    }
    json.dump(fixture, sys.stdout, indent=1)
    print()


if __name__ == '__main__':
    main()
