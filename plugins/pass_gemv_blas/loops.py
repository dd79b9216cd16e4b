"""CFG, dominators and natural loops of one function (llvmlite computes none of them).

Dominators: the iterative data-flow algorithm of Cooper, Harvey & Kennedy, "A Simple, Fast
Dominance Algorithm" (2001), over reverse post-order. Natural loops: for every back edge t → h
with h dominating t, the loop is h plus every block that reaches t without passing h; loops with
one header are merged (Aho, Lam, Sethi & Ullman, "Compilers", 2nd ed., §9.6.6).
"""

from __future__ import annotations

import attrs

from .ir_text import Function


@attrs.define
class Loop:
    """A natural loop: ``header``, ``blocks`` (set of block names), ``latches`` (sources of
    back edges), ``parent``/``children`` in the loop-nesting forest, ``depth`` (1 = outermost)."""

    header: str
    blocks: set
    latches: list
    parent: "Loop | None" = None
    children: list = attrs.field(factory=list)

    @property
    def depth(self) -> int:
        d, p = 1, self.parent
        while p is not None:
            d, p = d + 1, p.parent
        return d

    def exits(self, cfg: "CFG") -> list[tuple[str, str]]:
        """Edges (from inside, to outside) leaving the loop."""
        return [(b, s) for b in self.blocks for s in cfg.succs[b] if s not in self.blocks]


@attrs.define
class CFG:
    succs: dict
    preds: dict
    entry: str
    rpo: list
    idom: dict

    def dominates(self, a: str, b: str) -> bool:
        """True if block ``a`` dominates block ``b`` (both reachable)."""
        while True:
            if a == b:
                return True
            nb = self.idom.get(b)
            if nb is None or nb == b:
                return False
            b = nb


def build_cfg(fn: Function) -> CFG:
    """Successor/predecessor maps, reverse post-order and immediate dominators."""
    succs = {name: list(dict.fromkeys(b.succs())) for name, b in fn.blocks.items()}
    preds: dict = {name: [] for name in fn.blocks}
    for b, ss in succs.items():
        for s in ss:
            preds.setdefault(s, []).append(b)
    entry = fn.entry
    seen, post = set(), []
    stack = [(entry, iter(succs[entry]))]
    seen.add(entry)
    while stack:
        node, it = stack[-1]
        nxt = next(it, None)
        if nxt is None:
            post.append(node)
            stack.pop()
        elif nxt not in seen and nxt in succs:
            seen.add(nxt)
            stack.append((nxt, iter(succs[nxt])))
    rpo = post[::-1]
    order = {b: i for i, b in enumerate(rpo)}
    idom = {entry: entry}
    changed = True
    while changed:
        changed = False
        for b in rpo[1:]:
            ps = [p for p in preds[b] if p in idom]
            if not ps:
                continue
            new = ps[0]
            for p in ps[1:]:
                x, y = p, new
                while x != y:
                    while order[x] > order[y]:
                        x = idom[x]
                    while order[y] > order[x]:
                        y = idom[y]
                new = x
            if idom.get(b) != new:
                idom[b] = new
                changed = True
    return CFG(succs, preds, entry, rpo, idom)


def find_loops(cfg: CFG) -> list[Loop]:
    """All natural loops, with parent/children set; outer loops first."""
    by_header: dict[str, Loop] = {}
    for t in cfg.rpo:
        for h in cfg.succs[t]:
            if h in cfg.idom and cfg.dominates(h, t):
                body = {h}
                work = [t]
                while work:
                    b = work.pop()
                    if b in body:
                        continue
                    body.add(b)
                    work.extend(p for p in cfg.preds[b] if p in cfg.idom)
                loop = by_header.get(h)
                if loop is None:
                    by_header[h] = Loop(h, body, [t])
                else:
                    loop.blocks |= body
                    loop.latches.append(t)
    loops = sorted(by_header.values(), key=lambda lp: -len(lp.blocks))
    for i, inner in enumerate(loops):
        cands = [o for o in loops[:i] if inner.header in o.blocks and o is not inner]
        if cands:
            inner.parent = min(cands, key=lambda o: len(o.blocks))
            inner.parent.children.append(inner)
    return loops
