"""Export the shipped example model: a small Keras CNN with a residual branch.

Run from the repository root: ``python -m examples.make_example_model``.
"""
from examples.models import export_residual_cnn
from profiles import DEFAULT_MODEL_DIR

if __name__ == "__main__":
    export_residual_cnn(DEFAULT_MODEL_DIR, seed=0)
