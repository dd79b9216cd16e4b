"""A small reader of LLVM IR text (the subset clang-22 -O1 emits for C), for analysis.

llvmlite 0.50 parses and verifies IR but exposes neither a mutation API nor use/def maps with
names of unnamed values, so the pass reads the textual IR itself: functions → basic blocks →
instructions, each instruction with its result name, opcode, flags and operands, and the index
of its line in the module text (the rewrite edits lines). Reference: LLVM Language Reference
Manual (https://llvm.org/docs/LangRef.html), sections "Functions", "Instruction Reference".
"""

from __future__ import annotations

import re

import attrs

FAST_MATH_FLAGS = {"fast", "reassoc", "nnan", "ninf", "nsz", "arcp", "contract", "afn"}
INT_FLAGS = {"nuw", "nsw", "exact", "disjoint", "nneg", "samesign"}
GEP_FLAGS = {"inbounds", "nuw", "nusw"}
_NAME = r"%[-\w.$]+|%\"[^\"]*\""
_LABEL_RE = re.compile(r"^([-\w.$]+|\"[^\"]*\"):")
_LABEL_OPERAND_RE = re.compile(r"label (%[-\w.$]+)")
_META_TAIL_RE = re.compile(r"(,\s*![-\w.]+\s+!(\d+|\{[^}]*\}))+\s*$")


@attrs.define
class Instr:
    """One instruction. ``name``: result ("%13") or "" ; ``op``: opcode; ``flags``: set of
    keyword flags (nuw, nsw, fast, reassoc, inbounds, ...); ``ty``: main type as written
    (result type for arithmetic/loads/phis, the stored type for stores, the source element
    type for GEPs); ``ops``: operand value strings (see ``parse_instr``); ``line``: index of the
    first line in the module text; ``text``: the instruction text (metadata removed)."""

    name: str
    op: str
    flags: set
    ty: str
    ops: list
    line: int
    text: str
    block: str = ""
    extra: dict = attrs.field(factory=dict)


@attrs.define
class Block:
    name: str
    instrs: list
    label_line: int  # -1 for an implicit entry label

    @property
    def term(self) -> Instr:
        return self.instrs[-1]

    def succs(self) -> list[str]:
        return self.term.extra.get("succs", [])


@attrs.define
class Function:
    name: str
    header_line: int
    end_line: int  # index of the closing "}"
    blocks: dict  # name -> Block, in order
    defs: dict  # value name -> Instr
    args: list  # [(type, name)]
    linkage: str

    @property
    def entry(self) -> str:
        return next(iter(self.blocks))


def split_top(s: str, sep: str = ",") -> list[str]:
    """Split ``s`` at ``sep`` outside (), [], {}, <> and quotes."""
    out, depth, cur, quote = [], 0, [], False
    for ch in s:
        if ch == '"':
            quote = not quote
        elif not quote:
            if ch in "([{<":
                depth += 1
            elif ch in ")]}>":
                depth -= 1
            elif ch == sep and depth == 0:
                out.append("".join(cur).strip())
                cur = []
                continue
        cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return out


def split_type(s: str) -> tuple[str, str]:
    """Split "TYPE rest" into (TYPE, rest), TYPE possibly bracketed (``[37 x float]``)."""
    s = s.strip()
    if s and s[0] in "[<{":
        depth = 0
        for j, ch in enumerate(s):
            if ch in "[<{":
                depth += 1
            elif ch in "]>}":
                depth -= 1
                if depth == 0:
                    return s[: j + 1], s[j + 1:].strip()
    parts = s.split(None, 1)
    ty = parts[0]
    rest = parts[1] if len(parts) > 1 else ""
    if ty == "ptr" and rest.startswith("addrspace("):
        k = rest.index(")") + 1
        ty, rest = ty + " " + rest[:k], rest[k:].strip()
    return ty, rest


def last_value(s: str) -> str:
    """The value of an operand written "TYPE [attrs] VALUE"."""
    return s.split()[-1] if s.split() else s


def _strip_flags(words: list[str], allowed: set) -> tuple[set, list[str]]:
    flags = set()
    while words and words[0] in allowed:
        flags.add(words.pop(0))
    return flags, words


def parse_instr(text: str, line: int) -> Instr:
    """Parse one instruction (metadata attachments removed)."""
    text = _META_TAIL_RE.sub("", text.strip())
    name = ""
    body = text
    m = re.match(rf"^({_NAME})\s*=\s*(.*)$", text, re.S)
    if m:
        name, body = m.group(1), m.group(2)
    words = body.split(None, 1)
    op = words[0]
    rest = words[1] if len(words) > 1 else ""
    if op in ("tail", "musttail", "notail"):
        op, rest = rest.split(None, 1)
    ins = Instr(name, op, set(), "", [], line, text)
    w = rest.split()
    if op in ("add", "sub", "mul", "shl", "or", "and", "xor", "udiv", "sdiv", "urem", "srem",
              "lshr", "ashr", "fadd", "fsub", "fmul", "fdiv", "frem"):
        flags, w = _strip_flags(w, INT_FLAGS | FAST_MATH_FLAGS)
        ins.flags = flags
        ty, r = split_type(" ".join(w))
        ins.ty = ty
        ins.ops = [v.strip() for v in split_top(r)]
    elif op == "fneg":
        flags, w = _strip_flags(w, FAST_MATH_FLAGS)
        ins.flags = flags
        ty, r = split_type(" ".join(w))
        ins.ty, ins.ops = ty, [r.strip()]
    elif op in ("sext", "zext", "trunc", "ptrtoint", "inttoptr", "bitcast", "sitofp",
                "uitofp", "fptosi", "fptoui", "fpext", "fptrunc"):
        flags, w = _strip_flags(w, INT_FLAGS)
        ins.flags = flags
        src = " ".join(w)
        a, _, b = src.rpartition(" to ")
        sty, val = split_type(a)
        ins.ops = [val.strip()]
        ins.ty = b.strip()
        ins.extra["src_ty"] = sty
    elif op in ("icmp", "fcmp"):
        flags, w = _strip_flags(w, FAST_MATH_FLAGS | {"samesign"})
        ins.flags = flags
        ins.extra["pred"] = w[0]
        ty, r = split_type(" ".join(w[1:]))
        ins.ty = ty
        ins.ops = [v.strip() for v in split_top(r)]
    elif op == "phi":
        flags, w = _strip_flags(w, FAST_MATH_FLAGS)
        ty, r = split_type(" ".join(w))
        ins.ty = ty
        inc = []
        for part in re.findall(r"\[([^\[\]]*)\]", r):
            v, b = [p.strip() for p in split_top(part)]
            inc.append((v, b))
        ins.extra["incoming"] = inc
        ins.ops = [v for v, _ in inc]
    elif op == "getelementptr":
        flags, w = _strip_flags(w, GEP_FLAGS)
        ins.flags = flags
        parts = split_top(" ".join(w))
        ins.ty = parts[0]
        ins.ops = [last_value(p) for p in parts[1:]]
        ins.extra["idx_tys"] = [split_type(p)[0] for p in parts[2:]]
    elif op == "load":
        flags, w = _strip_flags(w, {"volatile", "atomic"})
        ins.flags = flags
        parts = split_top(" ".join(w))
        ins.ty = parts[0]
        ins.ops = [last_value(parts[1])]
    elif op == "store":
        flags, w = _strip_flags(w, {"volatile", "atomic"})
        ins.flags = flags
        parts = split_top(" ".join(w))
        ty, v = split_type(parts[0])
        ins.ty = ty
        ins.ops = [v.strip(), last_value(parts[1])]
    elif op == "select":
        flags, w = _strip_flags(w, FAST_MATH_FLAGS)
        parts = split_top(" ".join(w))
        ins.ty = split_type(parts[1])[0]
        ins.ops = [last_value(p) for p in parts]
    elif op in ("call", "invoke"):
        m2 = re.search(r"(@[-\w.$]+|%[-\w.$]+)\((.*)\)", rest, re.S)
        pre = rest[: m2.start()] if m2 else rest
        ins.flags = {t for t in pre.split() if t in FAST_MATH_FLAGS}
        ins.extra["callee"] = m2.group(1) if m2 else ""
        args = split_top(m2.group(2)) if m2 else []
        ins.ops = [last_value(a) for a in args]
        ins.extra["arg_tys"] = [split_type(a)[0] for a in args]
        ret = [t for t in pre.split() if t not in FAST_MATH_FLAGS]
        ins.ty = ret[-1] if ret else ""
    elif op == "alloca":
        ins.ty = split_top(rest)[0]
    else:
        ins.ops = re.findall(_NAME, rest)
    if op in ("br", "switch", "indirectbr", "invoke", "callbr"):
        ins.extra["succs"] = _LABEL_OPERAND_RE.findall(text)
        if op == "br" and rest.startswith("i1 "):
            ins.extra["cond"] = split_top(rest)[0].split()[-1]
    elif op in ("ret", "unreachable", "resume"):
        ins.extra["succs"] = []
    return ins


def _entry_number(define_line: str) -> str:
    """The implicit name of an unlabelled entry block: the next unnamed number after args."""
    inner = define_line[define_line.index("(") + 1: define_line.rindex(")")]
    nums = [int(x) for x in re.findall(r"%(\d+)(?=\s*[,)]|$)", inner + ")")]
    return "%" + str(max(nums) + 1 if nums else 0)


def parse_functions(text: str) -> list[Function]:
    """All function definitions of a module text, with blocks and instructions."""
    lines = text.split("\n")
    funcs = []
    i = 0
    n = len(lines)
    while i < n:
        ln = lines[i]
        if not ln.startswith("define "):
            i += 1
            continue
        header = i
        while not lines[i].rstrip().endswith("{"):
            i += 1
        define = " ".join(lines[header: i + 1])
        fname = re.search(r"@([-\w.$]+|\"[^\"]*\")\(", define).group(1)
        linkage = "internal" if re.match(r"define\s+(internal|private)\b", define) else "external"
        arg_text = define[define.index("(") + 1:]
        depth, j = 1, 0
        while depth and j < len(arg_text):
            depth += {"(": 1, ")": -1}.get(arg_text[j], 0)
            j += 1
        args = []
        for a in split_top(arg_text[: j - 1]):
            if a == "...":
                continue
            ty, _ = split_type(a)
            nm = a.split()[-1] if a.split()[-1].startswith("%") else ""
            args.append((ty, nm))
        i += 1
        blocks: dict[str, Block] = {}
        defs: dict[str, Instr] = {}
        cur = Block(_entry_number(define), [], -1)
        pending: list[str] = []
        start = i
        while lines[i].rstrip() != "}":
            raw = lines[i]
            s = raw.split(";", 1)[0].rstrip() if not raw.lstrip().startswith('"') else raw
            mlab = _LABEL_RE.match(raw)
            if mlab and not raw.startswith(" "):
                if cur.instrs:
                    blocks[cur.name] = cur
                lab = mlab.group(1)
                cur = Block("%" + lab, [], i)
            elif s.strip():
                if not pending:
                    start = i
                pending.append(s)
                joined = " ".join(p.strip() for p in pending)
                if joined.count("[") == joined.count("]"):
                    ins = parse_instr(joined, start)
                    ins.block = cur.name
                    cur.instrs.append(ins)
                    if ins.name:
                        defs[ins.name] = ins
                    pending = []
            i += 1
        if cur.instrs:
            blocks[cur.name] = cur
        funcs.append(Function(fname, header, i, blocks, defs, args, linkage))
        i += 1
    return funcs
