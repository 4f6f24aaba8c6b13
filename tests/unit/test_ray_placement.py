"""A Ray reservation larger than the cluster is a one-line error at once, not a timeout."""
from __future__ import annotations

import pytest

from lmrl.config import ConfigError
from lmrl.loops.on_ray import check_fits


def test_a_reservation_larger_than_the_cluster_is_refused_naming_the_knobs():
    with pytest.raises(ConfigError, match=r"reserves 3 CPU .* cluster has 2: lower dist.rollout_workers"):
        check_fits({"CPU": 2.0}, [{"CPU": 1}, {"CPU": 1}, {"CPU": 1}])


def test_a_missing_gpu_is_refused():
    with pytest.raises(ConfigError, match="reserves 1 GPU .* cluster has 0"):
        check_fits({"CPU": 8.0}, [{"CPU": 1, "GPU": 1}, {"CPU": 1}])


def test_a_reservation_that_fits_passes():
    check_fits({"CPU": 3.0, "GPU": 1.0}, [{"CPU": 1, "GPU": 1}, {"CPU": 1}, {"CPU": 1}])
