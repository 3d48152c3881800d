"""Save a graph as JSON, load it back and run it (also with the ``asyncflow`` command).

Run it with ``python examples/save_and_load.py [OUT.json]``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import numpy as np

import asyncflow as af


def main() -> None:
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(None, 2), name="x")
        scale = af.constant(np.array([2.0, -1.0], np.float32), name="scale")
        af.reduce_sum(x * scale, axis=1, name="y")

    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(tempfile.mkdtemp(), "graph.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(g.as_graph_def(), f)
    print(f"saved {len(g.get_operations())} ops to {path}")

    with open(path, encoding="utf-8") as f:
        graph_def = json.load(f)
    loaded = af.Graph()
    with loaded.as_default():
        af.import_graph_def(graph_def, name="")
    with af.Session(graph=loaded) as sess:
        print("y =", sess.run_sync("y:0", feed_dict={"x:0": [[1.0, 2.0], [3.0, 4.0]]}))
    print(f"the same from a shell: asyncflow run {path} --feed 'x=[[1,2],[3,4]]' --fetch y")


if __name__ == "__main__":
    main()
