"""A package that declares its operators in the entry-point group ``memory_explorer.operators``
(``memx_demo_ops-0.1.dist-info/entry_points.txt``): a test fixture of ``tests/test_functional.py``,
written for this project.  Nothing sets ``$EXPLORER_PLUGINS`` for it."""

import numpy as np

import operators


def _scale(block):
    """three times the input (entry-point demo)"""
    return np.asarray(block, dtype=np.float32) * 3.0


demo_scale = operators.from_function(_scale, name="demo_scale", axis_classes=(0, 0, 0))


class DemoShift(operators.Operator):
    """The input plus one: an Operator subclass named by the entry point."""

    name = "demo_shift"
    description = "the input plus one (entry-point demo)"

    def run(self, block):
        return np.asarray(block, dtype=np.float32) + 1.0
