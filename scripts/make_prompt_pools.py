"""Build the two extra prompt pools (code and multi-turn) from sources on every machine.

- ``data/prompts/python_stdlib_functions.jsonl``: code-completion prompts made from the public top-level functions
  of Python's own standard library (the interpreter running this script; read with ``ast``, nothing is imported).
  Each prompt is a function's signature and its docstring, to be completed by the target: the kind of prompt
  HumanEval asks, with none of HumanEval's problems. Licence: PSF-2.0 (the docstrings are CPython's).
- ``data/prompts/multi_turn_followups.jsonl``: two-turn conversations. The first turn is a Self-Instruct instruction
  (``self_instruct_seed_tasks.jsonl`` and ``user_oriented_instructions.jsonl``, Apache-2.0) or one of the code prompts
  above; the second is a follow-up request written for draftsmith (``FOLLOW_UPS`` below), so that training sees the
  target answer a second turn with its own first answer in the context (MT-bench's shape, none of its prompts).

Rows are shuffled with a fixed seed, so that the first N rows of a pool (what ``enqueue --limit`` takes) are a
mixed sample. The outputs are committed: rerun this only to rebuild them (``python scripts/make_prompt_pools.py``).
"""

from __future__ import annotations

import ast
import json
import random
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROMPTS = REPO / "data" / "prompts"
ASKS = ("Complete the code I provided.", "Implement this Python function.", "Write the body of this function.")
CODE_FOLLOW_UPS = (
    "Write three test cases for your function as assert statements.",
    "Explain how your code works, step by step.",
    "Make your function raise a ValueError with a clear message on invalid input.",
    "What is the time complexity of your solution? Can it be improved?",
    "Rewrite the function without using any imports.",
)
FOLLOW_UPS = (
    "Summarize your answer in two sentences.",
    "Rewrite your answer so that a ten-year-old can follow it.",
    "Give one more example, different from the ones above.",
    "What is the weakest part of your answer? Improve it.",
    "Turn your answer into a short bulleted list.",
    "Now answer again, but in a formal tone.",
)


def stdlib_functions(limit: int = 600, max_doc_lines: int = 12) -> list[dict]:
    """Public top-level functions of the standard library with a docstring, as code-completion prompts."""
    root = Path(sysconfig.get_paths()["stdlib"])
    rows, seen = [], set()
    for path in sorted(root.glob("*.py")):
        if path.name.startswith("_"):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_") or node.name in seen:
                continue
            doc = ast.get_docstring(node)
            if not doc or len(doc) < 40 or len(doc.splitlines()) > max_doc_lines:
                continue
            seen.add(node.name)
            body = "\n".join(("    " + line) if line else "" for line in doc.splitlines())
            code = f'def {node.name}({ast.unparse(node.args)}):\n    """{body.lstrip()}\n    """\n'
            rows.append({"module": path.stem, "name": node.name, "code": code})
    rng = random.Random(0)
    rng.shuffle(rows)
    out = []
    for i, r in enumerate(rows[:limit]):
        out.append({"id": f"stdlib-{r['module']}-{r['name']}", "module": r["module"],
                    "prompt": f"{ASKS[i % len(ASKS)]}\n\n{r['code']}"})
    return out


def multi_turn(code_rows: list[dict], n_code: int = 60) -> list[dict]:
    """Two-turn conversations: a Self-Instruct instruction (with its first input) or a code prompt, then a follow-up."""
    firsts = []
    for name in ("self_instruct_seed_tasks.jsonl", "user_oriented_instructions.jsonl"):
        for line in (PROMPTS / name).read_text().splitlines():
            row = json.loads(line)
            text = row["instruction"].strip()
            inputs = [i.get("input", "") for i in row.get("instances", []) if i.get("input")]
            if inputs:
                text = f"{text}\n\n{inputs[0].strip()}"
            firsts.append((f"{name.split('_')[0]}-{row['id']}", text, FOLLOW_UPS))
    firsts += [(r["id"], r["prompt"], CODE_FOLLOW_UPS) for r in code_rows[-n_code:]]  # not the pool's first rows
    rng = random.Random(1)
    rng.shuffle(firsts)
    return [{"id": f"mt-{fid}", "turns": [text, ups[i % len(ups)]]} for i, (fid, text, ups) in enumerate(firsts)]


def main() -> None:
    """Write both pools and print their sizes."""
    code = stdlib_functions()
    mt = multi_turn(code)
    for name, rows in (("python_stdlib_functions.jsonl", code), ("multi_turn_followups.jsonl", mt)):
        with (PROMPTS / name).open("w") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        print(f"{name}: {len(rows)} rows")


if __name__ == "__main__":
    main()
