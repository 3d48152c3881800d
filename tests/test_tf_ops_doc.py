"""``docs/tf-ops.md`` lists exactly the op types the importer accepts.

The table is written by ``docs/make_tf_ops.py``; this test fails while the committed
file differs from what the script would write (run it after adding an op type).
"""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import asyncflow as af

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_the_op_table_is_what_the_generator_writes() -> None:
    script = runpy.run_path(str(DOCS / "make_tf_ops.py"))
    text = (DOCS / "tf-ops.md").read_text(encoding="utf-8")
    assert script["render"](text) == text


def test_the_op_table_lists_every_supported_type_once() -> None:
    text = (DOCS / "tf-ops.md").read_text(encoding="utf-8")
    listed = re.findall(r"^\| `(\w+)` \|", text, re.M)
    assert listed == sorted(listed)
    assert set(listed) == set(af.compat.supported_tf_op_types())
    assert len(listed) == len(set(listed))
