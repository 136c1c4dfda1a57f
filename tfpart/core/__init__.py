"""The core types every layer of tfpart shares: the op graph (``graph``), the cluster
(``cluster``), the plan and its JSON form (``plan``), the op taxonomy (``ops``), FLOP
counts, units, dtypes, filter splits' vocabulary, the error family, the bounds on what a
user controls (``limits``), reading inputs and writing outputs safely, and phase timings.
They import nothing of tfpart above them (``pyproject.toml``'s layers contract)."""
