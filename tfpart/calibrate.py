"""Calibrate a device kind from measured kernel and copy times (``tfpart calibrate``).

Reads a kernel table (see :mod:`costmodel.measured`; its ``device_kind`` names a kind
whose datasheet peaks, bandwidth and multiprocessors the fit is of; its ``time_s`` and
``time_s_<precision>`` columns are read, never ``host_loop_s``, the host's dispatch)
and, optionally, a table of
host<->device copy times, and writes the kind's entry with its efficiency table
fitted per kernel class (:mod:`costmodel.calibration`) and its host link fitted as
latency + bytes / bandwidth over the pinned copies. The entry goes into a kinds file
(``profiles/device_kinds.json`` or one a cluster.json names with ``kinds_file``),
replacing the kind's old entry and keeping every other.

Writing ``-o``: the kinds file is merged into, not replaced, so the output rule of
:mod:`tfpart.core.output_files` applies as it does to a file of the same kind given
``--force``, without the flag: any kinds file may be merged into, one the user wrote
included, since every other kind and field of it is kept, each value as it was (a
number is written in full where six digits would change it); only the calibrated
kind's old entry goes, which is what calibrating it means. A file of any other kind, a
link, a folder or a device is refused in one line, and the file is written
atomically. A kinds file tfpart created carries its mark, renewed on each merge; a
user's is left unmarked, theirs still.

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
from tfpart.core.device_kinds import KernelEfficiency, kinds_from_dict, load_device_kinds
from tfpart.core.errors import ProfileError
from tfpart.core.output_files import (KINDS_FILE, check_output_file, marked, written_by_tfpart,
                                      write_output_file)


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
    note = "; calibrated: " + fitted_to(Path(kernels_path).name, profile,
                                        load_device_kinds(kinds_path)[name])
    if links_path is not None:
        latency, bandwidth = fit_link(link_rows(read_json(links_path, "copy table"),
                                                links_path))
        entry["host_link_bandwidth"] = float(f"{bandwidth:.4g}")
        entry["host_link_latency"] = float(f"{latency:.4g}")
        note += f", host link to {Path(links_path).name}"
    entry["source"] = source + note
    return name, entry, fitted


def fitted_to(table_name, profile, kind):
    """What a calibration was fitted to, for the kind's ``source``: the table, its
    kernel count (``(N kernels)``, which :mod:`costmodel.figures_basis` reads), the
    columns read and the GPU the table names.

    >>> from types import SimpleNamespace
    >>> from tfpart.core.device_kinds import load_device_kinds
    >>> ops = [{"time_s": 1e-6, "time_s_bf16": 1e-6, "host_loop_s": 1e-5}]
    >>> table = SimpleNamespace(ops=ops, meta={"hardware": {"gpu": "H100 SXM"}})
    >>> note = fitted_to("k.json", table, load_device_kinds()["H100"])
    >>> note.split(" fitted to ")[1]
    'k.json (1 kernels) by tfpart calibrate: time_s (at tf32), time_s_bf16; measured on H100 SXM'
    >>> "132 multiprocessors" in note, "host_loop_s" in note
    (True, False)
    """
    from costmodel.calibration import default_precision

    columns = sorted({key for op in profile.ops for key in op
                      if key.startswith("time_s_") and op[key] is not None})
    read = ", ".join([f"time_s (at {default_precision(kind)})", *columns])
    waves = f"waves of tiles over {kind.multiprocessors} multiprocessors, " \
        if kind.multiprocessors else ""
    hardware = profile.meta.get("hardware")
    gpu = hardware.get("gpu") if isinstance(hardware, dict) else None
    return (f"kernel efficiencies (roofline plateau, {waves}launch floor) fitted to "
            f"{table_name} ({len(profile.ops)} kernels) by tfpart calibrate: {read}"
            + (f"; measured on {gpu}" if isinstance(gpu, str) else ""))


def check_kinds_output(out):
    """OutputError unless the kinds file ``out`` may be merged into: absent, or a
    kinds file (see the module docstring). Checked before any work."""
    check_output_file(out, KINDS_FILE, force=True)


def write_kind(name, entry, out):
    """Put ``entry`` under ``name`` in the kinds file ``out`` (created if missing,
    every other entry kept; see the module docstring), once the file it makes loads."""
    out = Path(out)
    check_kinds_output(out)
    created = not out.exists()
    data = {"kinds": {}} if created else read_json(out, "kinds file")
    if not isinstance(data, dict) or not isinstance(data.get("kinds"), dict):
        raise ProfileError(out, "not a kinds file (no \"kinds\" object)")
    ours = created or written_by_tfpart(data)
    data["kinds"][name] = _six_digits(entry)
    input_files.json_text(data, out, ProfileError)  # one line naming a NaN
    text = format_kinds(marked(data, "calibrate", out, ProfileError) if ours else data)
    kinds_from_dict(json.loads(text)["kinds"], out)  # ProfileError naming the entry
    # created: another process's file made meanwhile is not merged into, but refused
    write_output_file(out, text, KINDS_FILE, force=not created, force_flag=None)
    load_device_kinds.cache_clear()
    return out


def _six_digits(value):
    """``value`` with every float cut to six significant digits (a fitted figure's
    precision; the file stays readable).

    >>> _six_digits({"a": [0.123456789, 2], "b": 1.92e11})
    {'a': [0.123457, 2], 'b': 192000000000.0}
    """
    if isinstance(value, dict):
        return {key: _six_digits(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_six_digits(item) for item in value]
    return float(f"{value:.6g}") if isinstance(value, float) else value


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
    """Compact JSON with floats short where that is exact (1.92e+11, not
    192000000000.0), in full where not (a user's figures are kept as they are).

    >>> _dump({"peak": 1.92e11, "exact": 0.1234567891, "whole": 5.0})
    '{"peak": 1.92e+11, "exact": 0.1234567891, "whole": 5.0}'
    """
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {_dump(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_dump(v) for v in value) + "]"
    if isinstance(value, float):
        short = format(value, ".6g")
        if float(short) != value:
            return json.dumps(value)
        return short if any(c in short for c in ".e") else short + ".0"  # stays a float
    return json.dumps(value)
