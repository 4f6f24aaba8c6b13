"""Evaluation: metrics (pass@k, diversity, calibration, abstention), the evaluator and the suite of
`lmrl eval`, comparisons of runs (`lmrl compare`), the HTML report."""
from lmrl.eval.metrics import mean_pass_at_k, pass_at_k
from lmrl.eval.report import write_report

__all__ = ["mean_pass_at_k", "pass_at_k", "write_report"]
