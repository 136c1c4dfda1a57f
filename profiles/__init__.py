"""Data: device kinds (datasheet figures), example clusters, example models.

Nothing here imports the rest of tfpart; the files are read by ``tfpart.core.cluster`` and
``costmodel``.
"""
from pathlib import Path

PROFILES_DIR = Path(__file__).resolve().parent
DEVICE_KINDS_FILE = PROFILES_DIR / "device_kinds.json"
CLUSTERS_DIR = PROFILES_DIR / "clusters"
MODELS_DIR = PROFILES_DIR / "models"
DEFAULT_CLUSTER_FILE = CLUSTERS_DIR / "local_3cpu.json"
DEFAULT_MODEL_DIR = MODELS_DIR / "residual_cnn"
