"""Everything that reads or writes TensorFlow protos.

TensorFlow is imported lazily, and its C++ start-up logging silenced before the first
import from any module of this package.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("GLOG_minloglevel", "2")  # absl's start-up INFO lines
