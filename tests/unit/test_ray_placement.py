"""A Ray reservation larger than the cluster is a one-line error at once, not a timeout; the bundles of
learner ranks and rollout workers follow `dist:`."""
from __future__ import annotations

import pytest

from lmrl.config import ConfigError
from conftest import toy_run_config
from lmrl.loops.on_ray import bundles, check_fits


def test_a_reservation_larger_than_the_cluster_is_refused_naming_the_knobs():
    with pytest.raises(ConfigError, match=r"reserves 3 CPU .* cluster has 2: lower dist.learner_ranks"):
        check_fits({"CPU": 2.0}, [{"CPU": 1}], [{"CPU": 1}, {"CPU": 1}])


def test_a_missing_gpu_is_refused():
    with pytest.raises(ConfigError, match="reserves 1 GPU .* cluster has 0"):
        check_fits({"CPU": 8.0}, [{"CPU": 1, "GPU": 1}], [{"CPU": 1}])


def test_a_reservation_that_fits_passes():
    check_fits({"CPU": 3.0, "GPU": 1.0}, [{"CPU": 1, "GPU": 1}], [{"CPU": 1}, {"CPU": 1}])


def test_learner_ranks_get_a_bundle_each_and_rollouts_stay_on_their_engines(tmp_path):
    ranks, workers = bundles(toy_run_config(tmp_path, 1, trainer={"threads": 2, "device": "cpu"},
                                            dist={"backend": "ray", "learner_ranks": 3, "rollout_workers": 4}))
    assert ranks == [{"CPU": 2}] * 3 and workers == []


def test_one_learner_rank_places_its_rollout_workers_after_it(tmp_path):
    ranks, workers = bundles(toy_run_config(tmp_path, 1, trainer={"threads": 1, "device": "cpu"},
                                            dist={"backend": "ray", "rollout_workers": 2, "worker_threads": 3}))
    assert ranks == [{"CPU": 1}] and workers == [{"CPU": 3}, {"CPU": 3}]


def test_learner_ranks_need_ray_and_the_synchronous_loop(tmp_path):
    with pytest.raises(ConfigError, match="dist.learner_ranks=2 places learner ranks as Ray actors"):
        toy_run_config(tmp_path, 1, dist={"backend": "local", "learner_ranks": 2})
    with pytest.raises(ConfigError, match="unset rollout.max_staleness"):
        toy_run_config(tmp_path, 1, rollout={"max_staleness": 1}, dist={"backend": "ray", "learner_ranks": 2})
