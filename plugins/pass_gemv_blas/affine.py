"""Integer polynomials over SSA values: the symbolic form of loop bounds and addresses.

A polynomial maps a monomial (sorted tuple of atom names) to an integer coefficient; ``()`` is
the constant term. Atoms are the outer and inner induction variables (``"@i"``, ``"@k"``) and
SSA values defined outside the loop nest (loop-invariant). ``i*ld + k`` with ``ld`` = ``%9`` is
``{("%9", "@i"): 1, ("@k",): 1}``. Scalar-evolution style: see Bachmann, Wang & Zima, "Chains of
recurrences" (ISSAC 1994) for the affine-recurrence view LLVM's SCEV implements.
"""

from __future__ import annotations

Poly = dict  # tuple[str, ...] -> int


def const(c: int) -> Poly:
    """The constant polynomial ``c``."""
    return {(): c} if c else {}


def atom(name: str) -> Poly:
    """The polynomial ``1·name``."""
    return {(name,): 1}


def add(a: Poly, b: Poly, sign: int = 1) -> Poly:
    """``a + sign·b``."""
    out = dict(a)
    for m, c in b.items():
        out[m] = out.get(m, 0) + sign * c
        if out[m] == 0:
            del out[m]
    return out


def scale(a: Poly, c: int) -> Poly:
    """``c·a``."""
    return {m: v * c for m, v in a.items()} if c else {}


def mul(a: Poly, b: Poly) -> Poly:
    """``a·b``."""
    out: Poly = {}
    for ma, ca in a.items():
        for mb, cb in b.items():
            m = tuple(sorted(ma + mb))
            out[m] = out.get(m, 0) + ca * cb
            if out[m] == 0:
                del out[m]
    return out


def uses(a: Poly, name: str) -> bool:
    """True if atom ``name`` occurs in ``a``."""
    return any(name in m for m in a)


def split_linear(a: Poly, ivs: tuple[str, ...]) -> dict | None:
    """Write ``a`` as ``c0 + Σ iv·c_iv`` with invariant c's; None if some monomial has two IV
    factors (e.g. i·k, k·k: not affine)."""
    parts: dict = {iv: {} for iv in ivs}
    parts[None] = {}
    for m, c in a.items():
        hits = [x for x in m if x in ivs]
        if len(hits) > 1:
            return None
        key = hits[0] if hits else None
        rest = list(m)
        if key is not None:
            rest.remove(key)
        parts[key][tuple(rest)] = parts[key].get(tuple(rest), 0) + c
    return parts


def subst(a: Poly, name: str, value: Poly) -> Poly:
    """Replace atom ``name`` by polynomial ``value``."""
    out: Poly = {}
    for m, c in a.items():
        term = const(c)
        for x in m:
            term = mul(term, value if x == name else atom(x))
        out = add(out, term)
    return out


def exact_div(a: Poly, d: int) -> Poly | None:
    """``a / d`` when every coefficient is divisible by ``d``, else None."""
    if any(c % d for c in a.values()):
        return None
    return {m: c // d for m, c in a.items()}


def is_const(a: Poly, c: int) -> bool:
    """True if ``a`` is the constant ``c``."""
    return a == const(c)
