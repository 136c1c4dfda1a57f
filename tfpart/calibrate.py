"""Calibrate a device kind from measured kernel and copy times (``tfpart calibrate``).

Reads a kernel table (see :mod:`costmodel.measured`; its ``device_kind`` names a kind
whose datasheet peaks and bandwidth the fractions are of) and, optionally, a table of
host<->device copy times, and writes the kind's entry with its efficiency table
fitted per kernel class (:mod:`costmodel.calibration`) and its host link fitted as
latency + bytes / bandwidth over the pinned copies. The entry goes into a kinds file
(``profiles/device_kinds.json`` or one a cluster.json names with ``kinds_file``),
replacing the kind's old entry and keeping every other.

Copy table format (``../shared/gpu/h100_links.json``)::

    {"device": "...", "rows": [{"bytes": 4192, "direction": "h2d", "pinned": true,
                                "median_s": 2.27e-05}, ...]}

Examples
--------
>>> rows = [{"bytes": n, "direction": "h2d", "pinned": True, "median_s": t}
...         for n, t in ((10, 2e-5), (1e6, 4e-5))] + [{"bytes": 10, "direction": "d2d",
...                                                  "median_s": 1e-5}]
>>> link_rows({"rows": rows}, "links.json")  # pinned host<->device copies only
[(10.0, 2e-05), (1000000.0, 4e-05)]
"""
from __future__ import annotations

import json
from pathlib import Path

from costmodel.calibration import fit_link
from costmodel.measured import MeasuredProfile
from profiles import DEVICE_KINDS_FILE
from tfpart.core import input_files
from tfpart.core.device_kinds import KernelEfficiency, load_device_kinds
from tfpart.core.errors import OutputError, ProfileError


def read_json(path, what):
    """The parsed JSON at ``path`` (bounded and strict, :mod:`tfpart.core.input_files`);
    ProfileError naming the file if it is not."""
    return input_files.read_json(path, ProfileError, what=f"a readable JSON {what}")


def link_rows(data, path):
    """``(bytes, seconds)`` of the pinned host<->device copies of a copy table."""
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise ProfileError(path, "rows: must be a list of copies")
    chosen = []
    for k, row in enumerate(data["rows"]):
        if not isinstance(row, dict):
            raise ProfileError(path, f"rows[{k}]: must be an object")
        for name in ("bytes", "median_s"):
            value = row.get(name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ProfileError(path, f"rows[{k}].{name}: must be a positive number")
        if row.get("direction") not in ("h2d", "d2h", "d2d"):
            raise ProfileError(path, f"rows[{k}].direction: must be h2d, d2h or d2d")
        if row["direction"] != "d2d" and row.get("pinned", True):
            chosen.append((float(row["bytes"]), float(row["median_s"])))
    if len(chosen) < 2:
        raise ProfileError(path, "rows: needs two or more pinned host<->device copies")
    return chosen


def calibrate(kernels_path, links_path=None, kinds_path=DEVICE_KINDS_FILE):
    """Fit the kind a kernel table names.

    Parameters
    ----------
    kernels_path : path
        A kernel table (format ``tfpart-measured-profile/1`` without ``fitted``).
    links_path : path, optional
        A copy table; without it the kind's host link stays as it was.
    kinds_path : path
        The kinds file whose entry for the kind gives the datasheet.

    Returns
    -------
    (str, dict, dict)
        The kind's name, its new kinds-file entry, and the fitted
        ``{class: KernelEfficiency}``.

    Raises
    ------
    tfpart.core.errors.ProfileError
        A table is missing or malformed (the message names the field), or names a
        kind the kinds file does not have.
    """
    # Loading validates the table (errors name the field) and fits it.
    profile = MeasuredProfile.load(kernels_path, load_device_kinds(kinds_path))
    name = profile.device_kind
    fitted = {cls: KernelEfficiency.parse(value)
              for cls, value in profile.fitted["efficiency"].items()}
    raw = read_json(kinds_path, "kinds file")["kinds"]
    entry = dict(raw[name])
    entry["efficiency"] = {cls: value.to_json() for cls, value in fitted.items()}
    source = entry["source"].split("; calibrated:")[0]
    note = (f"; calibrated: efficiency fitted to {Path(kernels_path).name} "
            f"({len(profile.ops)} kernels) by tfpart calibrate")
    if links_path is not None:
        latency, bandwidth = fit_link(link_rows(read_json(links_path, "copy table"),
                                                links_path))
        entry["host_link_bandwidth"] = float(f"{bandwidth:.4g}")
        entry["host_link_latency"] = float(f"{latency:.4g}")
        note += f", host link to {Path(links_path).name}"
    entry["source"] = source + note
    return name, entry, fitted


def write_kind(name, entry, out):
    """Put ``entry`` under ``name`` in the kinds file ``out`` (created if missing,
    every other entry kept), then check the file loads."""
    out = Path(out)
    data = read_json(out, "kinds file") if out.exists() else {"kinds": {}}
    if not isinstance(data, dict) or not isinstance(data.get("kinds"), dict):
        raise ProfileError(out, "not a kinds file (no \"kinds\" object)")
    data["kinds"][name] = entry
    staged = out.with_name(f".{out.name}.tmp")
    try:
        staged.write_text(format_kinds(data))
        load_device_kinds.__wrapped__(staged)
        staged.replace(out)
    except ProfileError as exc:
        raise ProfileError(out, exc.problem) from None
    except OSError as exc:
        raise OutputError(out, f"cannot write: {exc.strerror or exc}") from None
    finally:
        staged.unlink(missing_ok=True)
    load_device_kinds.cache_clear()
    return out


def format_kinds(data):
    """A kinds file as JSON a person can read and diff: one line per field, one per
    efficiency class."""
    def item(key, value, indent):
        return f"{' ' * indent}{json.dumps(key)}: {_dump(value)}"

    lines = []
    for key, value in data.items():
        if key != "kinds":
            lines.append(item(key, value, 2))
            continue
        kinds = []
        for name, entry in value.items():
            fields = []
            for field, field_value in entry.items():
                if field == "efficiency" and isinstance(field_value, dict):
                    classes = ",\n".join(item(c, v, 8) for c, v in field_value.items())
                    fields.append(f'      "efficiency": {{\n{classes}\n      }}')
                else:
                    fields.append(item(field, field_value, 6))
            kinds.append(f"    {json.dumps(name)}: {{\n" + ",\n".join(fields) + "\n    }")
        lines.append('  "kinds": {\n' + ",\n".join(kinds) + "\n  }")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def _dump(value):
    """Compact JSON with floats in at most 6 significant digits (1.92e+11, not
    192000000000.0)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {_dump(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_dump(v) for v in value) + "]"
    if isinstance(value, float):
        return format(value, ".6g")
    return json.dumps(value)
