"""Rewards: per-sample functions, safe scoring, aggregation of named components."""
from lmrl.rewards.compute import REWARD_AGGREGATIONS, RewardScorer
from lmrl.rewards.functions import REWARD_FNS, answers_match, extract_answer

__all__ = ["REWARD_AGGREGATIONS", "REWARD_FNS", "RewardScorer", "answers_match", "extract_answer"]
