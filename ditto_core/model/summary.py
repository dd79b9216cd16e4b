"""The summary of a model file that ``ditto inspect`` prints and ``Build.inspect()`` returns:
config, tokenizer, tensor table, sizes, bits per weight, and (with the build's build.json)
the quantize rule that decided each tensor. Plain data, no output: the CLI formats it."""

from __future__ import annotations

import math

import attrs

from . import kernel_paths as KP
from ditto_core.text.special_tokens import FIM_ROLES


def build_rules(record: dict | None) -> dict | None:
    """The quantize rules of a build (its build.json ``record``): ``{"rules": the
    --tensor-type rules, "tensors": name → the rule or reason that decided the tensor (for a
    matrix the size guard kept f32, the rule that planned it and that reason)}``;
    None without a record."""
    if not isinstance(record, dict):
        return None
    opts = record.get("options") if isinstance(record.get("options"), dict) else {}
    tensors = record.get("tensors") if isinstance(record.get("tensors"), dict) else {}

    def decided(t):  # the size guard overrides the rule that planned a codebook
        rule, reason = t.get("rule"), t.get("reason")
        if rule and reason and reason != rule:
            return f"{rule}, kept f32: {reason}"
        return rule or reason

    return {"rules": list(opts.get("tensor_types") or []),
            "tensors": {n: decided(t) for n, t in tensors.items() if isinstance(t, dict)}}


def inspect_summary(mf, record: dict | None = None, kernel_table=None) -> dict:
    """Config, tensor table and sizes of an open ModelFile, as plain data; with the build.json
    ``record`` of the build holding it, also the quantize ``rules`` and each tensor's
    ``rule``. ``mf``: a ``modelfile.ModelFile``; sizes in bytes, ``bpw_*`` in bits per
    weight. Each tensor's ``kernel`` is the GEMV path the runtime takes for it on
    ``kernel_table`` (a ``kernel_paths.Table``; default: the one this CPU runs, as the runtime
    chooses it), e.g. ``"avx512vbmi:i8_b4"``, ``"generic"``, ``"lookup"`` or None
    (kernel_paths.tensor_path; row tiles as ``DITTO_TILES`` sets them, a bad value raising
    DittoError); ``kernel_table`` in the result names the table."""
    kt = kernel_table or KP.active_table()
    tiles = KP.tiles_enabled()
    cls = KP.classifier_name(mf.config)
    tensors = []
    for t in mf.tensors.values():
        tensors.append({"name": t.name, "encoding": t.encoding, "shape": list(t.shape),
                        "bits": t.bits, "group_size": t.group_size,
                        "codebook_type": t.codebook_type, "offset": t.offset,
                        "bytes": t.nbytes, "bpw": 8.0 * t.nbytes / t.n_weights,
                        "theoretical_bytes": t.theoretical_bytes,
                        "kernel": KP.tensor_path(kt, t, cls, tiles)})
    n_weights = sum(t.n_weights for t in mf.tensors.values())
    payload = mf.payload_bytes
    theo = sum(r["theoretical_bytes"] for r in tensors)
    tok = mf.tokenizer
    rules = build_rules(record)
    if rules is not None:
        for r in tensors:
            r["rule"] = rules["tensors"].get(r["name"])
    return {
        **({"rules": rules["rules"]} if rules is not None else {}),
        "path": str(mf.path), "version": mf.version, "file_bytes": mf.file_size,
        "kernel_table": kt.name,
        "meta_bytes": mf.meta_size + 64,
        "config": attrs.asdict(mf.config),
        "tokenizer": {"kind": tok.kind, "n_tokens": len(tok.tokens), "n_merges": len(tok.merges),
                      "pre": tok.pre, "bos_id": tok.bos_id, "eos_id": tok.eos_id,
                      "add_bos": tok.add_bos, "chat_format": tok.chat_format,
                      "eog_ids": list(tok.eog_ids) or ([tok.eos_id] if tok.eos_id >= 0 else []),
                      "fim_ids": {role: i for role, i in zip(FIM_ROLES, tok.fim_ids) if i >= 0}},
        "n_tensors": len(tensors), "n_weights": n_weights,
        "payload_bytes": payload, "theoretical_bytes": theo,
        "overhead_percent": 100.0 * (payload - theo) / theo,
        "bpw_file": 8.0 * mf.file_size / n_weights,
        "bpw_payload": 8.0 * payload / n_weights,
        "tensors": tensors,
        "layouts": layouts(tensors),
    }


def layouts(tensors: list[dict]) -> list[dict]:
    """The codebook layouts of a summary's ``tensors`` and the kernel path of each: one entry
    per (bits, group_size, codebook_type, kernel) with its number of ``tensors``, ``weights``
    and ``bytes``, the most weights first. ``effective_group_sizes``: the Gs the kernels see
    for those tensors, G clamped to each row length (a G longer than the row is one sub-block
    per row), which with b decides the kernel path."""
    out: dict[tuple, dict] = {}
    for r in tensors:
        if r["encoding"] != "codebook":
            continue
        key = (r["bits"], r["group_size"], r["codebook_type"], r["kernel"])
        e = out.setdefault(key, {"bits": key[0], "group_size": key[1], "codebook_type": key[2],
                                 "kernel": key[3], "effective_group_sizes": [], "tensors": 0,
                                 "weights": 0, "bytes": 0})
        eff = min(r["group_size"], r["shape"][-1])
        if eff not in e["effective_group_sizes"]:
            e["effective_group_sizes"] = sorted(e["effective_group_sizes"] + [eff])
        e["tensors"] += 1
        e["weights"] += int(math.prod(r["shape"]))
        e["bytes"] += r["bytes"]
    return sorted(out.values(), key=lambda e: (-e["weights"], e["bits"], e["group_size"]))
