"""Parse the human-readable quantities of cluster.json: sizes, rates and durations.

Examples
--------
>>> parse_size("16GB"), parse_size("1.5 GiB"), parse_size(1024)
(16000000000.0, 1610612736.0, 1024.0)
>>> parse_rate("12.5GB/s"), parse_rate("100Gbit/s")
(12500000000.0, 12500000000.0)
>>> parse_duration("10us"), parse_duration(0.002)
(1e-05, 0.002)
"""
import re

_NUMBER_UNIT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z/]*)\s*$")
_SIZE = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_BITS = {"kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8, "tbit": 1e12 / 8}
_TIME = {"": 1, "s": 1, "ms": 1e3, "us": 1e6, "µs": 1e6, "ns": 1e9}  # divisors, exact


def _split(value, what):
    if isinstance(value, bool):
        raise ValueError(f"expected a {what}, got {value!r}")
    if isinstance(value, (int, float)):
        return float(value), ""
    match = _NUMBER_UNIT.match(str(value))
    if not match:
        raise ValueError(f"expected a {what} such as {_EXAMPLES[what]}, got {value!r}")
    return float(match.group(1)), match.group(2).lower()


_EXAMPLES = {"size": "'16GB' or 512e6", "rate": "'12GB/s' or 1e10", "duration": "'10us' or 1e-5"}


def parse_size(value):
    """Bytes from a number (bytes) or a string with a unit (B, KB..TB, KiB..TiB)."""
    number, unit = _split(value, "size")
    if unit not in _SIZE:
        raise ValueError(f"unknown size unit {unit!r} in {value!r}")
    return number * _SIZE[unit]


def parse_rate(value):
    """Bytes per second from a number or a string such as '16GB/s' or '100Gbit/s'."""
    number, unit = _split(value, "rate")
    unit = unit[:-2] if unit.endswith("/s") else unit
    if unit in _SIZE:
        return number * _SIZE[unit]
    if unit in _BITS:
        return number * _BITS[unit]
    raise ValueError(f"unknown rate unit in {value!r}")


def parse_duration(value):
    """Seconds from a number or a string such as '10us' or '2ms'."""
    number, unit = _split(value, "duration")
    if unit not in _TIME:
        raise ValueError(f"unknown time unit {unit!r} in {value!r}")
    return number / _TIME[unit]
