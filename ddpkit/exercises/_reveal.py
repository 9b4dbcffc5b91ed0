"""Self-checks for the exercises that ask "explain why": write an answer, then reveal the worked one.

Prose is not graded. The worked answer is not copied here: it is read from the chapter's solutions
notebook (``notebooks/solutions/NN_*.ipynb``, the section ``## Exercise k``), together with the cell
that proves it and that cell's recorded output, so the answer has one home.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


_LINK = re.compile(r"\]\((?!https?:|mailto:|#)([^)\s]+)\)")


def _from_the_chapter(markdown: str) -> str:
    """Links written in ``solutions/`` rewritten for the chapter beside it, where the answer is shown.

    >>> _from_the_chapter("[the chapter](../01_env_ranks.ipynb), [Ex. 2](#Exercise-2), [x](https://pytorch.org)")
    '[the chapter](01_env_ranks.ipynb), [Ex. 2](#Exercise-2), [x](https://pytorch.org)'
    >>> _from_the_chapter("[the other solution](02_init_methods.ipynb)")
    '[the other solution](solutions/02_init_methods.ipynb)'
    """
    def fix(m: re.Match) -> str:
        target = m.group(1)
        return f"]({target[3:] if target.startswith('../') else 'solutions/' + target})"

    return _LINK.sub(fix, markdown)


def worked_answer(key: str, notebooks: Path = NOTEBOOKS) -> str:
    """The markdown of exercise ``key``'s worked answer (``"05.5"``), its code cells and their recorded output.

    >>> "Exercise 1" in worked_answer("05.1")
    True
    """
    chapter, number = key.split(".")
    found = sorted((notebooks / "solutions").glob(f"{chapter}_*.ipynb"))
    if not found:
        return f"The worked answer is in the chapter's solutions notebook, `solutions/{chapter}_*.ipynb`, Exercise {number}."
    cells = json.loads(found[0].read_text())["cells"]
    parts, inside = [], False
    for cell in cells:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":  # a heading may open the cell or sit inside it
            kept = []
            for line in source.splitlines(keepends=True):
                if line.startswith("## "):
                    inside = line.strip() == f"## Exercise {number}"
                if inside:
                    kept.append(line)
            if kept:
                parts.append(_from_the_chapter("".join(kept).strip()))
            continue
        if inside:  # a code cell of the answer: its source and its recorded text output
            shown = "".join("".join(o.get("text", "")) for o in cell.get("outputs", []) if o.get("output_type") == "stream")
            parts.append(f"```python\n{source}\n```" + (f"\n\nIts recorded output:\n\n```\n{shown.rstrip()}\n```" if shown.strip() else ""))
    if not parts:
        return f"The worked answer is in `solutions/{found[0].name}`, Exercise {number}."
    return "\n\n".join(parts) + f"\n\n*From [the worked solutions](solutions/{found[0].name}), executed by CI like the chapters.*"


def reveal(key: str):
    """A self-check: a box for the learner's own answer and a button that shows the worked answer.

    >>> box = reveal("05.1")
    >>> box.children[1].description
    'Show the worked answer'
    >>> box.children[1].click(); "Exercise 1" in box.children[2].outputs[0]["data"]["text/markdown"]
    True
    """
    import ipywidgets as widgets

    answer = widgets.Textarea(placeholder="Your answer, in a few sentences. Not graded: compare it with the worked one.",
                              layout=widgets.Layout(width="100%", height="6em"))
    button = widgets.Button(description="Show the worked answer", layout=widgets.Layout(width="auto"))
    shown = widgets.Output()

    def show(_=None):
        text = worked_answer(key)
        # set the outputs directly: a click may arrive on another thread, where ``with shown:`` is unsafe
        shown.outputs = ({"output_type": "display_data", "metadata": {},
                          "data": {"text/markdown": text, "text/plain": text}},)

    button.on_click(show)
    return widgets.VBox([answer, button, shown])
