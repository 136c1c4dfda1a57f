"""``tfpart cluster probe`` on three local ``tfpart worker`` processes: every pair of
devices gets a measured link (the median of its rounds, each round on record: bandwidth,
latency and the executor time of a copy), the
file gets the measured cost of launching a step, and the cost model reads them."""
import json
import subprocess
import sys

import pytest

from tfpart.local_workers import LocalWorkers


@pytest.mark.slow
@pytest.mark.any_onednn
def test_probed_links_are_written_and_read(tmp_path):
    from tfpart.core.cluster import load_cluster

    with LocalWorkers(3, tmp_path) as workers:
        before = json.loads(workers.path.read_text())
        done = subprocess.run([sys.executable, "-m", "tfpart.cli", "cluster", "probe",
                               str(workers.path), "-o", str(tmp_path / "probed.json"),
                               "--rounds", "3", "--repeats", "5"],
                              capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(workers.path.read_text()) == before  # -o: the input is kept
    probed = json.loads((tmp_path / "probed.json").read_text())
    pairs = probed["links"]["pairs"]
    assert len(pairs) == 3  # every pair of the three devices
    cluster = load_cluster(tmp_path / "probed.json")
    names = cluster.device_names
    for pair in pairs:
        rounds = pair["measured"]["bandwidth"]
        assert len(rounds) == 3 and min(rounds) <= pair["bandwidth"] <= max(rounds)
        assert min(pair["measured"]["latency"]) <= pair["latency"] <= max(
            pair["measured"]["latency"])
        assert min(pair["measured"]["message_cost"]) <= pair["message_cost"] <= max(
            pair["measured"]["message_cost"])
        assert pair["cpu_copy"] is True
        a, b = (names.index(name) for name in pair["between"])
        assert cluster.link(a, b).bandwidth == pytest.approx(pair["bandwidth"])
        assert cluster.link(a, b).latency == pytest.approx(pair["latency"])
        assert cluster.link(a, b).message_cost == pytest.approx(pair["message_cost"])
    assert probed["step_overhead"] > 0 and cluster.step_overhead == probed["step_overhead"]
    assert "Links probed (3 rounds)" in done.stdout
