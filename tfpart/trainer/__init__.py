"""``tfpart train``: the training loop (``loop``: data, evaluation, logs, checkpoints;
synchronous through the data-parallel compile), the asynchronous modes on parameter
servers (``asynchronous``) and their update rules (``delay_compensation``), each layer
importing only the ones after it (``pyproject.toml``)."""
