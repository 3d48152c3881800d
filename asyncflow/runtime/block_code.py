"""A block of a partition's program written as one Python function.

The straight-line interpreter (:mod:`asyncflow.runtime.interpreter`) runs a
partition's program a block at a time: the started nodes the block joins first,
then up to ``CHECK_EVERY`` instructions.  A block is one function with a line per
instruction, its slots written in as constants, the callables it calls (and the
pending marker ``P``) its parameters' defaults::

    def block(vals, step, P, K1, O3):
        if vals[0] is P: return <Join of node 0>  # a join: the value is not there yet
        vals[4] = K1(vals[0], vals[3]); vals[0] = None  # a kernel, then its last reads
        vals[6] = P; step.start(<Start>, 5, [vals[4]], True); vals[4] = None  # a call
        O3(vals)  # any other instruction: its closure
        return None

so a node costs the kernel's call and its slots' reads and writes, not a closure's
call, its unpacking and the loop around it.  The function returns None when the
block ran, or the join whose value has not arrived (nothing after it ran: the
program comes back to the same block).  A block followed by one that joins also
checks that block's first join ahead, on its own last line (the program then
resumes at the next block: a block that must wait is not called only to wait).  A
kernel that raises leaves through its line, which names the node (:func:`node_of`).

Writing and compiling Python costs ~10 µs a line, ten closures' worth, so a block's
code is compiled once per *shape* (what each line is, and how many slots it reads
and frees) with a placeholder for every constant, and each block of that shape is
that code with its own constants (``CodeType.replace``): a long chain's blocks are
all alike, and the run that lowers a 100,000-node chain takes ~1.2 µs a node (its
closures took ~1.4).
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["FILENAME", "Block", "BlockWriter", "calls_of", "node_of"]

#: A block: ``block(vals, step)`` runs it, or returns the join that waits.
Block = Callable[[list[Any], Any], Any]

#: Shape -> (the template's code, per constant of it: the placeholder's number or -1).
_TEMPLATES: dict[tuple[Any, ...], tuple[types.CodeType, tuple[int, ...]]] = {}
_MAX_TEMPLATES = 1024
_TEMPLATES_LOCK = threading.Lock()
#: The blocks' file name (a traceback names the block and its line; in angle
#: brackets, as ``<string>``: no file to look for, for linecache or coverage tools).
FILENAME = "<asyncflow program block>"
#: A block's globals: it reads none (its callables are its parameters).
_GLOBALS: dict[str, Any] = {"__builtins__": {}}


class BlockWriter:
    """Collects one block's lines (:meth:`join`, :meth:`kernel`, :meth:`start`,
    :meth:`call`): each line's shape, its constants and its callables; then
    :meth:`make` gives the block's function (its shape's code, written and compiled
    only for the first block of that shape)."""

    __slots__ = ("_objects", "_shape", "_values", "where")

    def __init__(self, pending: Any) -> None:
        self._shape: list[tuple[str, int, int]] = []
        #: The constants, in the order the lines write them (their placeholders').
        self._values: list[Any] = []
        #: The pending marker and the callables the lines call: the function's
        #: parameters after ``vals`` and ``step``, given as defaults (a local's read,
        #: no dict per block).
        self._objects: list[Any] = [pending]
        #: The node of each line (index: the line number; -1 for none).
        self.where: list[int] = [-1, -1]  # (no line 0; line 1 is the ``def``)

    def join(self, slot: int, join: Any) -> None:
        """Wait here (return ``join``) while ``slot`` holds the pending marker."""
        self._shape.append(("j", 0, 0))
        self._values += (slot, join)
        self.where.append(-1)

    def kernel(
        self,
        node: int,
        kernel: Callable[..., Any],
        ins: Sequence[int],
        out: int,
        frees: Sequence[int],
    ) -> None:
        """Node ``node``: ``kernel`` over slots ``ins`` into slot ``out``, then ``frees``."""
        self._shape.append(("k", len(ins), len(frees)))
        self._values += (out, *ins, *frees)
        self._objects.append(kernel)
        self.where.append(node)

    def start(
        self, node: int, token: Any, ins: Sequence[int], out: int, frees: Sequence[int]
    ) -> None:
        """Started node ``node``: its value pending in ``out``, the node handed to the
        step (``Step.start``, ``token`` its token) with slots ``ins``, then ``frees``."""
        self._shape.append(("s", len(ins), len(frees)))
        self._values += (out, token, node, *ins, *frees)
        self.where.append(node)

    def call(self, node: int, op: Callable[[list[Any]], None]) -> None:
        """Node ``node`` as its closure ``op(vals)``."""
        self._shape.append(("o", 0, 0))
        self._objects.append(op)
        self.where.append(node)

    def make(self) -> Block:
        """The block's function."""
        shape = tuple(self._shape)
        template = _TEMPLATES.get(shape)
        if template is None:
            template = _compile(shape)
            with _TEMPLATES_LOCK:  # (steps of several threads may lower programs)
                _TEMPLATES[shape] = template
                if len(_TEMPLATES) > _MAX_TEMPLATES:
                    del _TEMPLATES[next(iter(_TEMPLATES))]  # the oldest
        code, numbers = template
        values = self._values
        consts = tuple(c if k < 0 else values[k] for c, k in zip(code.co_consts, numbers))
        return types.FunctionType(
            code.replace(co_consts=consts), _GLOBALS, "block", tuple(self._objects)
        )


def _compile(shape: tuple[tuple[str, int, int], ...]) -> tuple[types.CodeType, tuple[int, ...]]:
    """The code of blocks of ``shape``, each constant a placeholder (``"\\0<n>"``: the
    n-th value a writer collects), and per constant of the code its placeholder's
    number (-1: a constant of its own, as None)."""
    count = 0

    def const() -> str:  # the next value's placeholder
        nonlocal count
        count += 1
        return repr(f"\0{count - 1}")

    def slots(n: int) -> str:
        return ", ".join(f"vals[{const()}]" for _ in range(n))

    def frees(n: int) -> str:
        return "".join(f"; vals[{const()}] = None" for _ in range(n))

    names = ["P"]
    lines = []
    for k, (kind, n_in, n_free) in enumerate(shape):
        if kind == "j":
            lines.append(f" if vals[{const()}] is P: return {const()}")
        elif kind == "k":
            names.append(f"K{k}")
            out = const()
            lines.append(f" vals[{out}] = K{k}({slots(n_in)}){frees(n_free)}")
        elif kind == "s":
            out, token, node = const(), const(), const()
            lines.append(
                f" vals[{out}] = P; step.start({token}, {node}, [{slots(n_in)}], True)"
                + frees(n_free)
            )
        else:
            names.append(f"O{k}")
            lines.append(f" O{k}(vals)")
    source = "\n".join([f"def block(vals, step, {', '.join(names)}):", *lines, " return None"])
    (code,) = (
        c for c in compile(source, FILENAME, "exec").co_consts if isinstance(c, types.CodeType)
    )
    numbers = tuple(
        int(c[1:]) if isinstance(c, str) and c.startswith("\0") else -1 for c in code.co_consts
    )
    return code, numbers


def node_of(block: Block, where: Sequence[int], exc: BaseException) -> int:
    """The node whose line of ``block`` raised ``exc`` (-1: none found)."""
    code = block.__code__
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is code:
            return where[tb.tb_lineno]
        tb = tb.tb_next
    return -1


def calls_of(block: Block, where: Sequence[int]) -> list[tuple[int, Callable[..., Any]]]:
    """(node, callable) of each line of ``block`` that calls a kernel or a closure."""
    code = block.__code__
    defaults = block.__defaults__ or ()
    names = code.co_varnames[code.co_argcount - len(defaults) : code.co_argcount]
    # (A callable's parameter is named after its line: K3 or O3 is line 3 after the def.)
    return [(where[int(n[1:]) + 2], f) for n, f in zip(names, defaults, strict=True) if n != "P"]
