"""Rewards: per-sample and per-group functions, safe scoring, aggregation of named components."""
from lmrl.rewards.compute import GROUP_REWARD_FNS, REWARD_AGGREGATIONS, RewardScorer, find_component
from lmrl.rewards.functions import REWARD_FNS, answers_match, extract_answer
import lmrl.rewards.judges, lmrl.rewards.judge_training  # noqa: F401,E401  (register the judge rewards)
import lmrl.rewards.code, lmrl.rewards.program_tests, lmrl.rewards.sql_result  # noqa: F401,E401  (register code_tests, program_tests, sql_result)
import lmrl.rewards.group, lmrl.rewards.novelty, lmrl.rewards.pared  # noqa: F401,E401  (registers the group rewards)
import lmrl.rewards.shaped, lmrl.rewards.aggregations  # noqa: F401,E401  (registers shaped rewards and aggregations)
import lmrl.rewards.env_reward  # noqa: F401,E402  (registers the env reward)
import lmrl.rewards.coact, lmrl.rewards.seif  # noqa: F401,E401,E402  (register CoAct and SEIF)
import lmrl.rewards.hindsight_critique  # noqa: F401,E402  (registers the teacher context that calls a judge)
import lmrl.rewards.process_reward  # noqa: F401,E402  (registers process_reward_model)
import lmrl.rewards.structured, lmrl.rewards.constraints, lmrl.rewards.finance  # noqa: F401,E401,E402  (register json_schema, smt_check, finance)
import lmrl.rewards.translation, lmrl.rewards.retrieval  # noqa: F401,E401,E402  (register translation, retrieval)
import lmrl.rewards.web_page  # noqa: F401,E402  (registers web_page)
import lmrl.rewards.molecule, lmrl.rewards.recall  # noqa: F401,E401,E402  (register molecule, molecule_status, recall_exact)
import lmrl.rewards.stages  # noqa: F401,E402  (registers structpo_rules)
import lmrl.rewards.critique, lmrl.rewards.clarity, lmrl.rewards.genac  # noqa: F401,E401,E402  (STC, CLARity, GenAC)

__all__ = ["GROUP_REWARD_FNS", "REWARD_AGGREGATIONS", "REWARD_FNS", "RewardScorer", "answers_match",
           "extract_answer", "find_component"]
